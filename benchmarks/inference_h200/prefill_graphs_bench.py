"""The prefill call eager, from piecewise CUDA graphs and from whole-call graphs, side by side (S2 Pro
shape, FP8), each call's host time, wall time and GPU time apart.

Why: the served engine's GPU spans (2026-12-06d) put prefill at 31-36 % of the engine's stream time a
step, ~10 ms a one-prompt call, where 16 x 512 tokens in one call run at ~78k tokens/s (~4.5 ms for
a prompt's 350 tokens). The piecewise graphs leave one prompt host-bound (2026-12-02-graphs: host
9.2 ms of its 10.6); the whole-call graphs (``TTSFLEET_PREFILL_WHOLE_GRAPHS=on``) were built to end
that, and served slower (call 16: their prefill span 5.5 -> 6.8 ms a step). This says per path how
much of a call is the GPU's own work and how much the host's.

For 1 / 2 / 4 / 8 prompts of 300-400 tokens (a new length every call), one prompt of 64-128 and of
450-510 tokens, and a 100-160-token chunk continuing a 256-token head (masked attention), it
alternates the sides on the same cache and reports medians (min / max) of ``CALLS``: ``host`` until
the call returns, ``done`` until its GPU work ends, and ``gpu``: the same call queued behind a
``torch.cuda._sleep`` longer than its host time, CUDA events around it, so the GPU runs it without
waiting for launches (flagged when the host outran the sleep). The whole side exists for one-piece
calls only. Logits against the eager side's (relative L2 error, argmax). Then torch.profiler's
kernels by GPU time for four one-prompt calls per side (kernels replayed from a graph show where
CUPTI reports them). Usage on the device:
``python3 -m benchmarks.inference_h200.prefill_graphs_bench OUT.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
from torch.profiler import ProfilerActivity, profile
from ttsfleet.inference.loader import load_model
from ttsfleet.inference.model import PrefillPiece
from ttsfleet.inference.prefill_graphs import PrefillGraphs, row_buckets

PROMPTS = (1, 2, 4, 8)
#: one-prompt calls at other lengths: (tokens from, tokens to)
LONE_LENGTHS = ((64, 128), (450, 510))
#: one-prompt continuing chunks: (tokens from, tokens to, the head already in the slot): the masked
#: attention (a prompt past the server's default 256-token chunk goes on this way)
CONTINUING = ((100, 160, 256),)
CALLS = 10
SLOTS = 16  # + 1 scratch
SEQ = 1024
SIDES = ("eager", "piecewise", "whole")
#: the GPU's sleep ahead of a call timed for its GPU work alone: longer than any side's host time
SLEEP_MS = 120.0


def random_pieces(model, n: int, g: torch.Generator, lo: int = 300, hi: int = 400) -> list[PrefillPiece]:  # noqa: ANN001
    """``n`` fresh prompts of ``lo``-``hi`` random tokens (a new length every call, as in the server),
    into slots ``0 .. n-1``."""
    c = model.config
    out = []
    for slot in range(n):
        t = int(torch.randint(lo, hi, (1,), generator=g))
        ids = torch.randint(0, max(c.semantic_begin_id - 1000, c.semantic_begin_id // 2), (t,), generator=g)
        codes = torch.zeros(c.num_codebooks, t, dtype=torch.int64)
        out.append(PrefillPiece(slot, torch.cat([ids[None], codes]), 0))
    return out


def _use(graphs: PrefillGraphs, side: str) -> PrefillGraphs | None:
    """The graphs object as ``side`` uses it (whole-call graphs switched on for the whole side only)."""
    if side == "eager":
        return None
    graphs.whole = side == "whole"
    return graphs


def sleep_cycles(ms: float) -> int:
    """Cycles of ``torch.cuda._sleep`` that keep the GPU busy ~``ms`` (measured, clocks vary)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    torch.cuda._sleep(10_000_000)
    end.record()
    torch.cuda.synchronize()
    return int(10_000_000 * ms / start.elapsed_time(end))


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def _timed(model, cache, pieces, graphs, cycles: int) -> dict[str, float]:  # noqa: ANN001
    """One call's host and done ms, then on CUDA the same call behind a GPU sleep: its GPU ms (on the
    CPU the GPU ms is the done ms: nothing runs apart from the host)."""
    _sync(model.device)
    t0 = time.perf_counter()
    model.prefill_batch(cache, pieces, graphs=graphs)
    t1 = time.perf_counter()
    _sync(model.device)
    out = {"host": (t1 - t0) * 1e3, "done": (time.perf_counter() - t0) * 1e3}
    if model.device.type != "cuda":
        return {**out, "host_behind_sleep": 0.0, "gpu": out["done"]}
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(cycles)
    start.record()
    t2 = time.perf_counter()
    model.prefill_batch(cache, pieces, graphs=graphs)
    end.record()
    out["host_behind_sleep"] = (time.perf_counter() - t2) * 1e3
    torch.cuda.synchronize()
    out["gpu"] = start.elapsed_time(end)
    return out


def _stats(values: list[float]) -> dict:
    return {"median": round(statistics.median(values), 2), "min": round(min(values), 2),
            "max": round(max(values), 2)}


def _call_pieces(model, cache, n: int, g: torch.Generator, lo: int, hi: int,  # noqa: ANN001
                 start: int) -> list[PrefillPiece]:
    """A call's pieces; with ``start``, each slot first gets a ``start``-token head (untimed) and its
    piece continues there (the timed calls rewrite the same positions)."""
    pieces = random_pieces(model, n, g, lo, hi)
    if not start:
        return pieces
    model.prefill_batch(cache, random_pieces(model, n, g, start, start + 1))
    return [PrefillPiece(p.slot, p.tokens, start) for p in pieces]


def _side_by_side(model, cache, graphs, n: int, g: torch.Generator, cycles: int,  # noqa: ANN001
                  lo: int = 300, hi: int = 400, calls: int = CALLS, start: int = 0) -> dict:
    sides = SIDES if n == 1 else SIDES[:2]
    runs: dict[str, dict[str, list[float]]] = {s: {} for s in sides}
    errs: dict[str, list[float]] = {s: [] for s in sides[1:]}
    agree = dict.fromkeys(sides[1:], 0)
    for _ in range(calls):
        pieces = _call_pieces(model, cache, n, g, lo, hi, start)
        slots = torch.tensor([p.slot for p in pieces], device=model.device)
        for side in sides:
            for k, v in _timed(model, cache, pieces, _use(graphs, side), cycles).items():
                runs[side].setdefault(k, []).append(v)
            logits = cache.pending_logits[slots].clone()
            if side == "eager":
                ref = logits
                continue
            errs[side].append(float((logits - ref).norm() / ref.norm()))
            agree[side] += int(torch.equal(logits.argmax(-1), ref.argmax(-1)))
    rows = sum(p.tokens.shape[1] for p in pieces)
    graphs.whole = True
    row = {"prompts": n, "tokens": f"{lo}-{hi}" + (f" after {start}" if start else ""), "rows": rows,
           "whole_fit": graphs.whole_fit(rows, start + rows) if n == 1 else None,  # (row bucket, keys)
           **{f"{side}_{k}_ms": _stats(v) for side, r in runs.items() for k, v in r.items()},
           "host_outran_sleep": sorted(s for s, r in runs.items() if max(r["host_behind_sleep"]) > SLEEP_MS),
           **{f"{s}_logits_rel_err_max": max(e) for s, e in errs.items()},
           **{f"{s}_argmax_agree": f"{a}/{calls}" for s, a in agree.items()}}
    print(_row_line(row, sides), flush=True)
    return row


def _row_line(row: dict, sides: tuple[str, ...]) -> str:
    cells = "; ".join(f"{s} host {row[f'{s}_host_ms']['median']} / done {row[f'{s}_done_ms']['median']} / "
                      f"gpu {row[f'{s}_gpu_ms']['median']} ms" for s in sides)
    errs = ", ".join(f"{s} rel err <= {row[f'{s}_logits_rel_err_max']:.2e}, argmax {row[f'{s}_argmax_agree']}"
                     for s in sides[1:])
    return f"{row['prompts']} x {row['tokens']} tokens ({row['rows']} rows): {cells}; {errs}"


def _profile(model, cache, graphs, side: str, g: torch.Generator) -> list[dict]:  # noqa: ANN001
    """The kernels of four one-prompt calls by GPU time (and each op's CPU self time)."""
    cuda = model.device.type == "cuda"
    with profile(activities=[ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]) as prof:
        for _ in range(4):
            model.prefill_batch(cache, random_pieces(model, 1, g), graphs=_use(graphs, side))
        _sync(model.device)
    events = prof.key_averages()
    key = "self_device_time_total" if cuda else "self_cpu_time_total"
    print(f"-- {side}, four one-prompt calls, by {'GPU' if cuda else 'CPU'} time", flush=True)
    print(events.table(sort_by=key, row_limit=15), flush=True)
    top = sorted(events, key=lambda e: -(e.self_device_time_total + e.self_cpu_time_total))[:30]
    return [{"op": e.key, "calls": e.count, "self_gpu_us": round(e.self_device_time_total, 1),
             "self_cpu_us": round(e.self_cpu_time_total, 1)} for e in top]


def _capture(model, cache) -> tuple[PrefillGraphs, dict]:  # noqa: ANN001
    cuda = model.device.type == "cuda"
    mem0 = torch.cuda.memory_reserved() if cuda else 0
    t0 = time.perf_counter()
    graphs = PrefillGraphs(model, cache, SLOTS, row_buckets(4096), whole=True, whole_max_rows=512)
    if cuda:  # on the CPU the same objects run their segments and whole calls eagerly
        graphs.capture()
    info = {"buckets": graphs.buckets, "whole_graphs": sorted(graphs.whole_graphs),
            "capture_s": round(time.perf_counter() - t0, 2),
            "graph_mem_gib": round(((torch.cuda.memory_reserved() if cuda else 0) - mem0) / 2**30, 3)}
    print(f"captured {len(graphs.graphs)} buckets x {graphs.n_segments} segments and "
          f"{len(graphs.whole_graphs)} whole-call graphs in {info['capture_s']} s, "
          f"+{info['graph_mem_gib']} GiB reserved", flush=True)
    if not graphs.whole:
        raise SystemExit("the whole-call graphs failed to capture (see the log above)")
    return graphs, info


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("out", nargs="?", help="where the JSON report goes")
    p.add_argument("--model", default="s2-pro", help="model config (tiny: the CPU check)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--calls", type=int, default=CALLS, help="calls per side and row")
    p.add_argument("--prompts", default=",".join(map(str, PROMPTS)), help="prompts per call, comma-separated")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    a = _args(argv)
    cuda = a.device == "cuda"  # the CPU check: float32 weights as they are
    model = load_model(a.model, device=a.device, dtype=torch.bfloat16 if cuda else torch.float32,
                       quantize="bsgemm_fp8" if cuda else "bf16", max_seq_len=SEQ)
    cache = model.new_cache(SLOTS + 1, SEQ)
    g = torch.Generator().manual_seed(3)
    prompts = [int(n) for n in a.prompts.split(",")]
    for n in prompts:  # warm the eager path (Triton JIT, cuBLAS heuristics) before timing
        model.prefill_batch(cache, random_pieces(model, n, g))
    graphs, info = _capture(model, cache)
    cycles = sleep_cycles(SLEEP_MS) if cuda else 0
    calls = [_side_by_side(model, cache, graphs, n, g, cycles, calls=a.calls) for n in prompts]
    calls += [_side_by_side(model, cache, graphs, 1, g, cycles, lo, hi, a.calls) for lo, hi in LONE_LENGTHS]
    calls += [_side_by_side(model, cache, graphs, 1, g, cycles, lo, hi, a.calls, start)
              for lo, hi, start in CONTINUING]
    report = {"device": torch.cuda.get_device_name() if cuda else str(model.device),
              "torch": torch.__version__, "model": a.model, **info, "sleep_ms": SLEEP_MS, "calls": calls,
              "profile_one_prompt_x4": {s: _profile(model, cache, graphs, s, g) for s in SIDES}}
    if a.out:
        with open(a.out, "w") as f:
            json.dump(report, f, indent=2)
    return report


if __name__ == "__main__":
    main()
