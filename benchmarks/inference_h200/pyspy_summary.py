"""Where each thread of a server spends its samples: a py-spy ``--format raw`` profile, summarised.

Usage: ``python3 -P benchmarks/inference_h200/pyspy_summary.py PROFILE.txt[.gz] [MIN_SHARE]
[--steady]`` prints, per thread, its sample count and every function (file:line) on the stack in at
least ``MIN_SHARE`` (default 0.04) of that thread's samples — inclusive time, so a caller and its
callee both appear —
then the frames the samples ended in (self time: for a thread blocked in a native call, the line that
made it). ``--steady`` drops start-up (graph capture, Triton compiles, the codec's build) and the
engine's idle wait for work, so an ``--idle`` profile of a whole ``bench engine`` run reads as its
measured window.
"""

from __future__ import annotations

import collections
import gzip
import sys

#: Frames whose samples are start-up or idle, not the steady window (``--steady``).
STARTUP_OR_IDLE = ("capture", "_do_compile", "build_slot_decoder",
                   "_ingest (ttsfleet/inference/engine.py:564)")


def steady(lines: list[str]) -> list[str]:
    return [ln for ln in lines if not any(mark in ln for mark in STARTUP_OR_IDLE)]


def summarise(lines: list[str], min_share: float) -> list[str]:
    per_thread: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[tuple[str, str]] = collections.Counter()
    leaves: collections.Counter[tuple[str, str]] = collections.Counter()
    for line in lines:
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        frames = stack.split(";")
        per_thread[frames[0]] += int(count)
        leaves[(frames[0], frames[-1])] += int(count)
        for frame in set(frames[1:]):
            inclusive[(frames[0], frame)] += int(count)
    out = []
    for thread, total in per_thread.most_common():
        out.append(f"== {thread}: {total} samples")
        for title, counts in (("", inclusive), ("-- ended in (self)", leaves)):
            out += [title] if title else []
            rows = sorted(((n, f) for (t, f), n in counts.items() if t == thread), reverse=True)
            out += [f"{n / total * 100:5.1f}% {f}" for n, f in rows if n >= min_share * total]
    return out


def main() -> None:
    args = [a for a in sys.argv[1:] if a != "--steady"]
    path = args[0]
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        lines = f.read().splitlines()
    if "--steady" in sys.argv:
        lines = steady(lines)
    print("\n".join(summarise(lines, float(args[1]) if len(args) > 1 else 0.04)))


if __name__ == "__main__":
    main()
