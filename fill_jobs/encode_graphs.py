"""One CUDA graph per input shape of the fill job's codec encode (issue #25).

Why it was built: on an H100 (2026-12-05c, ``encode_stages.json`` of call4) a 40.5 ms bf16 pass over
4 x 10 s looked launch-bound — the float32 residual-codebook search with the first and last convs at
10.5 ms (340x its floor), the quantizer's window transformer at 12.6 ms (50x). What it measured
(2026-12-05d, ``benchmarks/fill_jobs/RESULTS.md``): the eager codes exactly, 0.6-1.9 % faster — that
stage reading did not reproduce (the pass is 20.7 ms, the search 2.6 ms) — so ``BatchEncoder`` keeps
it off by default. The codec is a pure function of its input batch, and with bucketed shapes
(``BatchEncoder.bucket_shapes``) a job meets a few shapes many times: each is captured once.

How: the first batch of a shape runs eagerly on a side stream (cuDNN's autotuner, Triton compiles,
lazy buffers such as a longer RoPE table are made there, outside the capture), then the same call
is captured; later batches of that shape copy into the captured input and replay. All graphs share
one memory pool: they are replayed one at a time and each output is read before the next replay
(the caller copies it), so what one replay leaves in the pool is never needed again. A shape whose
capture fails (an op that syncs with the host, say) runs eagerly from then on, its reason kept.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from ttsfleet.inference.graph_capture import on_side_stream

log = logging.getLogger("ttsfleet.fill_jobs.encode_graphs")


@dataclass
class _Captured:
    static_in: torch.Tensor
    graph: Any  # torch.cuda.CUDAGraph
    static_out: torch.Tensor


#: Most shapes captured: each keeps its input buffer (a 240 s batch at 44.1 kHz is 42 MB), and a job's
#: bucketed shapes are a few dozen (eight widths per octave, power-of-two batch parts).
MAX_SHAPES = 64


class ShapeGraphs:
    """``fn`` (a tensor -> tensor function with no state that changes between calls) replayed from a
    CUDA graph per input shape and dtype, for up to ``max_shapes`` shapes (later ones run eagerly);
    its output is valid until the next call."""

    def __init__(self, fn: Callable[[torch.Tensor], torch.Tensor], max_shapes: int = MAX_SHAPES) -> None:
        self.fn, self.max_shapes = fn, max_shapes
        self.captured: dict[tuple, _Captured] = {}
        self.eager_shapes: dict[tuple, str] = {}  # shape -> why it runs eagerly
        self._pool: Any = None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        key = (tuple(x.shape), x.dtype, x.device)
        entry = None if key in self.eager_shapes else self.captured.get(key) or self._first_of_shape(key, x)
        if entry is None:
            return self.fn(x)
        entry.static_in.copy_(x)
        entry.graph.replay()
        return entry.static_out

    def _first_of_shape(self, key: tuple, x: torch.Tensor) -> _Captured | None:
        """A new shape captured, or None with the reason it runs eagerly kept (past the cap, or a
        capture that failed)."""
        if len(self.captured) >= self.max_shapes:
            self.eager_shapes[key] = f"over the {self.max_shapes} shapes captured"
            return None
        try:
            entry = self.captured[key] = self._capture(x)
        except Exception as e:  # noqa: BLE001 - any capture failure: that shape runs eagerly
            self.eager_shapes[key] = f"{type(e).__name__}: {e}".splitlines()[0][:200]
            log.warning("encode graph for %s not captured (%s): eager", key[0], self.eager_shapes[key])
            return None
        return entry

    def _capture(self, x: torch.Tensor) -> _Captured:
        if x.device.type != "cuda":
            raise RuntimeError(f"CUDA graphs need a CUDA tensor, not one on {x.device}")
        static_in = x.clone()
        with on_side_stream(x.device):
            self.fn(static_in)  # the warm-up: autotuner, compiles and lazy buffers outside the capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            static_out = self.fn(static_in)
        self._pool = graph.pool()
        return _Captured(static_in, graph, static_out)
