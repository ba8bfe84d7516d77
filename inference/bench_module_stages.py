"""GPU time per module stage of a model pass, against each stage's floor: the accounting the codec
benchmarks share (``benchmarks/inference_h200/codec_stages.py``: a decode push;
``encode_stages.py``: the fill job's encode).

Why here: both tables need the same parts — CUDA events at a stage's forward hooks (the median over
passes), its FLOPs (``FlopCounterMode``'s running total at the hooks), the least HBM bytes it moves
(parameters, input and output, once) and the floors those give at two ceilings measured in the same
process (a bf16 GEMM's rate, the copy bandwidth) — and a copy of them per script drifts. Benchmark
support, not served code (as :mod:`.bench_engine`)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from .bench_engine import call_ms


@dataclass
class StageRow:
    name: str
    ms: float  # median GPU (CPU: wall) ms of the stage within an eager pass
    gflop: float
    mbytes: float  # parameters + input + output, once
    compute_floor_ms: float
    memory_floor_ms: float

    @property
    def floor_ms(self) -> float:
        return max(self.compute_floor_ms, self.memory_floor_ms)

    def as_dict(self) -> dict[str, Any]:
        """The row as a report holds it: its fields and its floor."""
        return asdict(self) | {"floor_ms": self.floor_ms}


class StageMarks:
    """Per stage: a clock at its forward's entry and exit (CUDA events, or wall time on the CPU), and
    the FLOP counter's total at both (when one is running) and the bytes it moves at least."""

    def __init__(self, stages: list[tuple[str, nn.Module]], cuda: bool) -> None:
        self.cuda, self.flops = cuda, None
        self.clocks: dict[str, list[tuple[Any, Any]]] = {n: [] for n, _ in stages}
        self.flop_counts: dict[str, float] = {}
        self.nbytes: dict[str, int] = {}
        self.handles = []
        for name, module in stages:
            params = sum(p.numel() * p.element_size() for p in module.parameters())
            self.handles.append(module.register_forward_pre_hook(self._enter(name)))
            self.handles.append(module.register_forward_hook(self._leave(name, params)))

    def _now(self) -> Any:
        if not self.cuda:
            return time.perf_counter()
        ev = torch.cuda.Event(enable_timing=True)
        ev.record()
        return ev

    def _enter(self, name: str) -> Callable[..., None]:
        def hook(module: nn.Module, args: tuple) -> None:
            self.clocks[name].append((self._now(), None))
            if self.flops is not None:
                self.flop_counts[name] = self.flop_counts.get(name, 0.0) - self.flops.get_total_flops()
        return hook

    def _leave(self, name: str, params: int) -> Callable[..., None]:
        def hook(module: nn.Module, args: tuple, out: Any) -> None:
            start, _ = self.clocks[name][-1]
            self.clocks[name][-1] = (start, self._now())
            if self.flops is not None:
                self.flop_counts[name] += self.flops.get_total_flops()
            self.nbytes[name] = params + tensor_bytes(args[0]) + tensor_bytes(out)
        return hook

    def stage_ms(self, name: str, last: int) -> float:
        """Median ms over the ``last`` passes (each pass enters a stage once; earlier ones warmed up)."""
        spans = self.clocks[name][-last:]
        if self.cuda:
            torch.cuda.synchronize()
            return statistics.median(a.elapsed_time(b) for a, b in spans)
        return statistics.median((b - a) * 1000 for a, b in spans)

    def remove(self) -> None:
        for h in self.handles:
            h.remove()


def tensor_bytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def ceilings(device: torch.device) -> dict[str, float]:
    """A bf16 GEMM's rate (TFLOP/s) and the copy bandwidth (GB/s, bytes read + written), measured here;
    on a GPU the bandwidth as every kernel benchmark here measures it (``kernels.bench.copy_bandwidth``)."""
    n = 8192 if device.type == "cuda" else 512
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    gemm_ms = median_call_ms(lambda: a @ a, device)
    if device.type == "cuda":
        from ttsfleet.kernels.bench import copy_bandwidth

        copy_gbs = copy_bandwidth() / 1e9
    else:  # (the CPU run checks the harness; its ceilings are not a measurement of anything served)
        src = torch.empty(1 << 23, dtype=torch.bfloat16)
        dst = torch.empty_like(src)
        copy_gbs = 2 * src.nbytes / median_call_ms(lambda: dst.copy_(src), device) / 1e6
    return {"bf16_tflops": 2 * n**3 / gemm_ms / 1e9, "copy_gbs": copy_gbs, "gemm_n": n}


def median_call_ms(fn: Callable[[], Any], device: torch.device, reps: int = 10) -> float:
    """Median ms of ``reps`` calls after 3 warm-up calls."""
    for _ in range(3):
        fn()
    return statistics.median(call_ms(fn, device) for _ in range(reps))


def stage_row(name: str, ms: float, flop: float, nbytes: int, ceil: dict[str, float]) -> StageRow:
    return StageRow(name, ms, flop / 1e9, nbytes / 1e6, flop / ceil["bf16_tflops"] / 1e9,
                    nbytes / ceil["copy_gbs"] / 1e6)


def stage_table(stages: list[tuple[str, nn.Module]], one_pass: Callable[[], Any], device: torch.device,
                reps: int, ceil: dict[str, float], rest_name: str) -> tuple[float, float, list[StageRow]]:
    """``one_pass`` timed with the stages' hooks on: 2 warm-up passes, ``reps`` timed ones (after
    :func:`median_call_ms`'s own warm-up), then one under the FLOP counter. Returns the pass's median
    ms, its FLOPs, and a row per stage followed by ``rest_name``'s row for what the stages leave."""
    for _ in range(2):
        one_pass()
    marks = StageMarks(stages, device.type == "cuda")
    try:
        pass_ms = median_call_ms(one_pass, device, reps)
        stage_ms = {name: marks.stage_ms(name, reps) for name, _ in stages}  # (before the slow FLOP pass)
        with FlopCounterMode(display=False) as counter:
            marks.flops = counter
            one_pass()
        total_flop = counter.get_total_flops()
        rows = [stage_row(name, stage_ms[name], marks.flop_counts[name], marks.nbytes[name], ceil)
                for name, _ in stages]
    finally:
        marks.remove()
    rest = stage_row(rest_name, pass_ms - sum(r.ms for r in rows),
                     total_flop - sum(r.gflop * 1e9 for r in rows), 0, ceil)
    return pass_ms, total_flop, [*rows, rest]


def print_stage_rows(rows: list[dict[str, Any]], name_width: int = 58) -> None:
    """A report's stage rows as a plain table: ms, GFLOP, MB, the floor and how far above it."""
    print(f"{'stage':{name_width}s} {'ms':>8s} {'GFLOP':>8s} {'MB':>8s} {'floor ms':>9s} {'x floor':>8s}")
    for r in rows:
        ratio = r["ms"] / r["floor_ms"] if r["floor_ms"] > 0 else float("nan")
        print(f"{r['name']:{name_width}s} {r['ms']:8.3f} {r['gflop']:8.2f} {r['mbytes']:8.1f} "
              f"{r['floor_ms']:9.3f} {ratio:8.1f}")
