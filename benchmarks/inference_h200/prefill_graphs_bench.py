"""The prefill call with and without its piecewise CUDA graphs, side by side (S2 Pro shape, FP8).

Why: ``prefill_host.py`` measured a prefill call at 47-72 ms of host time for ~8 ms of GPU work
(2026-12-02, run4); :mod:`ttsfleet.inference.prefill_graphs` replays everything but attention
from graphs. Prediction written before the run: the per-layer host cost falls from ~1.3 ms to the
eager attention's ~0.3 ms, so a one-prompt call from ~50 to ~12-15 ms of host time, and GPU time
grows by at most the padding (<= 25 % more rows) plus two copies per segment.

For 1 / 2 / 4 / 8 prompts of 300-400 tokens (a new length every call) it alternates eager and
graph calls on the same cache and reports, per side, the host time until the call returns and
until its GPU work is done (medians of ``CALLS``, min / max); the graphs' capture time and memory;
and how far the graph path's last-position logits sit from the eager path's on the same pieces
(relative L2 error, argmax agreement). Then torch.profiler's CPU self time per op of four one-prompt
graph calls. Usage on the device: ``python3 -m benchmarks.inference_h200.prefill_graphs_bench OUT.json``.
"""

from __future__ import annotations

import json
import statistics
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile
from ttsfleet.inference.loader import load_model
from ttsfleet.inference.prefill_graphs import PrefillGraphs, row_buckets

from benchmarks.inference_h200.prefill_host import random_pieces

PROMPTS = (1, 2, 4, 8)
CALLS = 10
SLOTS = 16  # + 1 scratch


def _call(model, cache, pieces, graphs) -> tuple[float, float]:  # noqa: ANN001
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    model.prefill_batch(cache, pieces, graphs=graphs)
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) * 1e3, (time.perf_counter() - t0) * 1e3


def _stats(values: list[float]) -> dict:
    return {"median": round(statistics.median(values), 2), "min": round(min(values), 2),
            "max": round(max(values), 2)}


def _side_by_side(model, cache, graphs, n: int, g: torch.Generator) -> dict:  # noqa: ANN001
    runs: dict[str, dict[str, list[float]]] = {s: {"host": [], "done": []} for s in ("eager", "graphs")}
    errs, agree = [], 0
    for _ in range(CALLS):
        pieces = random_pieces(model, n, g)
        slots = torch.tensor([p.slot for p in pieces], device="cuda")
        for side, gr in (("eager", None), ("graphs", graphs)):
            host, done = _call(model, cache, pieces, gr)
            runs[side]["host"].append(host)
            runs[side]["done"].append(done)
            logits = cache.pending_logits[slots].clone()
            if side == "eager":
                ref = logits
        errs.append(float((logits - ref).norm() / ref.norm()))
        agree += int(torch.equal(logits.argmax(-1), ref.argmax(-1)))
    row = {"prompts": n, "rows": sum(p.tokens.shape[1] for p in pieces),
           **{f"{side}_{k}_ms": _stats(v) for side, r in runs.items() for k, v in r.items()},
           "logits_rel_err_max": max(errs), "argmax_agree": f"{agree}/{CALLS}"}
    print(f"{n} prompts: host eager {row['eager_host_ms']['median']} ms vs graphs "
          f"{row['graphs_host_ms']['median']} ms; done {row['eager_done_ms']['median']} vs "
          f"{row['graphs_done_ms']['median']} ms; logits rel err <= {max(errs):.2e}, argmax {agree}/{CALLS}",
          flush=True)
    return row


def _profile(model, cache, graphs, g: torch.Generator) -> list[dict]:  # noqa: ANN001
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(4):
            model.prefill_batch(cache, random_pieces(model, 1, g), graphs=graphs)
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=20), flush=True)
    return [{"op": e.key, "calls": e.count, "self_cpu_us": round(e.self_cpu_time_total, 1)}
            for e in sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:30]]


def main() -> None:
    model = load_model("s2-pro", device="cuda", dtype=torch.bfloat16, quantize="bsgemm_fp8", max_seq_len=1024)
    cache = model.new_cache(SLOTS + 1, 1024)
    g = torch.Generator().manual_seed(3)
    for n in PROMPTS:  # warm the eager path (Triton JIT, cuBLAS heuristics) before timing
        model.prefill_batch(cache, random_pieces(model, n, g))
    torch.cuda.synchronize()
    mem0 = torch.cuda.memory_reserved()
    t0 = time.perf_counter()
    graphs = PrefillGraphs(model, cache, SLOTS, row_buckets(4096))
    graphs.capture()
    capture_s = time.perf_counter() - t0
    mem_gb = (torch.cuda.memory_reserved() - mem0) / 2**30
    print(f"captured {len(graphs.graphs)} buckets x {graphs.n_segments} segments in {capture_s:.1f} s, "
          f"+{mem_gb:.2f} GiB reserved", flush=True)
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "buckets": graphs.buckets, "capture_s": round(capture_s, 2), "graph_mem_gib": round(mem_gb, 3),
              "calls": [_side_by_side(model, cache, graphs, n, g) for n in PROMPTS],
              "profile_graphs_one_prompt_x4": _profile(model, cache, graphs, g)}
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()
