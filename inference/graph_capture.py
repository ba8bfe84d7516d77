"""One CUDA graph capture at a time per process.

The engine thread captures the decode graphs while the codec thread captures its own and warms up
cuDNN. A capture in CUDA's default ("global") mode is invalidated by an unsafe call from any other
thread (an allocation, cuDNN's benchmark sync), and a thread-local capture is still broken by work
that syncs with the capturing stream. Measured on the H200 (2026-12-02, run2-served-fast): with
both threads capturing at start, the decode capture failed and the server decoded eagerly at a
third of its speed. So every capture, and the codec's set-up around it, holds this lock.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

CAPTURE_LOCK = threading.Lock()


@contextmanager
def on_side_stream(device: Any = None) -> Iterator[None]:
    """Run the body (a capture's eager warm-up: lazy allocations, autotuning, Triton compiles) on a
    fresh side stream that starts after the current stream's work and that the current stream then
    waits for, as CUDA graph capture wants its warm-up done. ``device``: the CUDA device (None: the
    current one)."""
    import torch

    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        yield
    torch.cuda.current_stream(device).wait_stream(side)


def capture_after_warmup(fn: Callable[[], Any], pool: Any = None, warmups: int = 2) -> tuple[Any, Any]:
    """``fn()`` run ``warmups`` times on a side stream (:func:`on_side_stream`), then captured into a
    CUDA graph (in ``pool`` when given): (the graph, what the captured call returned, which each
    replay rewrites). The caller holds the workspace scope its kernels need."""
    import torch

    with on_side_stream():
        for _ in range(warmups):
            fn()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        out = fn()
    return graph, out
