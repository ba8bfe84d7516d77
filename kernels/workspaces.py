"""The split-K / one-launch kernels' workspaces: float32 partial sums and int32 tickets, reused by
every launch that shares an owner.

Why a module of its own: a CUDA graph bakes the workspace's address into its launches, so the rules
that keep eager launches safe (one buffer set per stream, grown when a launch needs more) break
under capture. Three faults that followed from them (a c=128 served run whose whole decode batch
went non-finite in one graph replay on an H100 while the same step run eagerly was finite,
2026-12-06f, ``benchmarks/inference_h200/next_calls.sh 23``):

* growing replaced the buffers and freed the old ones, which graphs captured earlier still write;
* a buffer first made inside a capture is zeroed by a memset recorded in that graph only: until that
  graph replays, every other graph sharing the buffer finds its tickets holding whatever was there;
* stream handles come from PyTorch's pool and are reused, so a stream key may name two streams'
  buffers over time, the graph capture stream's among them.

So: an owner's buffers are never freed once outgrown (kept for the process, a few MB each); a graph
family (the engine's decode graphs, the prefill's, a benchmark's) names its own owner
(:func:`new_owner`) with :func:`workspace_scope` around both its eager warm-up and its capture, so
its buffers are made and zeroed eagerly and no eager launch on any stream shares them; a scoped
capture that would have to make or grow a buffer gets a :class:`WorkspaceUnderCapture` error (its
caller falls back to eager launches); and an unscoped capture gets buffers of its own per launch,
zeroed inside the graph before each replay of that launch (correct anywhere, one memset a launch).
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Hashable, Iterator
from contextlib import contextmanager

import torch

#: (device index, owner) -> [partials float32, tickets int32]; the owner is a stream handle for
#: eager launches, or a :func:`workspace_scope` name
_WS: dict[tuple[int, Hashable], list[torch.Tensor]] = {}
#: outgrown buffers: a captured graph may still point at them, so they are never freed
_KEPT: list[torch.Tensor] = []
_SCOPE = threading.local()
#: tickets made at least this many at a time (launches index them by tile)
MIN_TICKETS = 1024
_OWNERS = itertools.count(1)


class WorkspaceUnderCapture(RuntimeError):
    """A launch inside a CUDA graph capture needed a workspace its owner had not yet made."""


def new_owner(label: str) -> tuple[str, int]:
    """A workspace owner no other code has: ``(label, a number unique to this process)``."""
    return label, next(_OWNERS)


@contextmanager
def workspace_scope(owner: Hashable) -> Iterator[None]:
    """Launches on this thread in the body use ``owner``'s workspaces, whatever their stream: wrap a
    graph family's warm-up and capture in one scope (an owner no other code uses), so the buffers its
    graphs bake are made eagerly and belong to it alone."""
    previous = getattr(_SCOPE, "owner", None)
    _SCOPE.owner = owner
    try:
        yield
    finally:
        _SCOPE.owner = previous


def workspace(dev: torch.device, n_part: int, n_tickets: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(partials, tickets)`` holding at least ``n_part`` floats and ``n_tickets`` zeroed tickets.

    Tickets are zero between launches (each launch resets those it used), so launches that run one
    after another (one stream, or one graph family replayed on one stream) share them. Owner: the
    current :func:`workspace_scope`, else the current stream (0 on a CPU: the interpreter)."""
    owner = getattr(_SCOPE, "owner", None)
    capturing = dev.type == "cuda" and torch.cuda.is_current_stream_capturing()
    if owner is None and capturing:  # the graph's own, zeroed by it: no other launch shares them
        return (torch.empty(max(n_part, 1), device=dev, dtype=torch.float32),
                torch.zeros(max(n_tickets, 1), device=dev, dtype=torch.int32))
    if owner is None:
        owner = torch.cuda.current_stream(dev).cuda_stream if dev.type == "cuda" else 0
    key = (dev.index or 0, owner)
    ws = _WS.get(key)
    if ws is not None and ws[0].numel() >= n_part and ws[1].numel() >= n_tickets:
        return ws[0], ws[1]
    if capturing:
        have = "none" if ws is None else f"{ws[0].numel()} partials, {ws[1].numel()} tickets"
        raise WorkspaceUnderCapture(
            f"a captured launch needs {n_part} partials and {n_tickets} tickets of workspace owner "
            f"{owner!r} (has {have}): run the same launches eagerly in the same workspace_scope first")
    if ws is not None:
        _KEPT.extend(ws)
    old_p, old_t = (ws[0].numel(), ws[1].numel()) if ws is not None else (0, 0)
    ws = [torch.empty(max(n_part, old_p, 1), device=dev, dtype=torch.float32),
          torch.zeros(max(n_tickets, old_t, MIN_TICKETS), device=dev, dtype=torch.int32)]
    _WS[key] = ws
    return ws[0], ws[1]
