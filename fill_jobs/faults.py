"""Fault injection for crash tests: ``TTSFLEET_FILL_FAULT=<point>[:<n>]`` SIGKILLs the job itself.

Points: ``after-audio`` (a batch's audio is visible, its part file is not), ``after-part`` (the
part file is written, the checkpoint is not), ``after-manifest`` (the shard manifest is written,
the checkpoint does not yet say complete). ``n`` (default 1) picks the n-th time the point is
reached. Unset in production, this costs one dictionary lookup per commit.
"""

from __future__ import annotations

import os
import signal

ENV = "TTSFLEET_FILL_FAULT"
_seen: dict[str, int] = {}


def maybe_crash(point: str) -> None:
    spec = os.environ.get(ENV)
    if not spec:
        return
    name, _, nth = spec.partition(":")
    if name != point:
        return
    _seen[point] = _seen.get(point, 0) + 1
    if _seen[point] == int(nth or 1):
        os.kill(os.getpid(), signal.SIGKILL)
