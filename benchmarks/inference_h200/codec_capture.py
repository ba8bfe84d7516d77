"""What the codec's graph capture at server start costs, and what cutting it costs the pushes (issue #25).

Why: with channels-last codec convs the H200 server became ready 159-179 s after start, 130-142 s of
it the codec process capturing 44 graphs (11 stream buckets x frames 1, 2, 4, 8), against 79 s with
NCL (2026-12-04, run8 / run10 / run11): the catalog's ``model_load_s`` went 91 -> 169 s, and the
autoscaler's forecast horizon with it. Most of a capture's time is cuDNN's autotuner timing
candidate kernels for each new conv shape (``torch.backends.cudnn.benchmark``, at most
``benchmark_limit`` candidates per shape). Each configuration runs in a fresh process (the
autotuner's choices are cached per process): the serving decoder (S2 size, random weights, bf16,
fused Snake, ``plan.slots`` = 128) built and captured as ``codec_batch.build_slot_decoder`` does,
timed; then a few pushes' graph replays (CUDA-event medians). Prints a table; JSON to ``argv[1]``.

    python3 -m benchmarks.inference_h200.codec_capture OUT.json        # on the device, repo root
    python3 -m benchmarks.inference_h200.codec_capture OUT.json --configs "cl:limit=10,cl:limit=2,ncl"
    python3 -P benchmarks/inference_h200/codec_capture.py OUT.json --device cpu --tiny   # CPU smoke run

A configuration is ``LAYOUT[:key=value ...]`` (``cl`` / ``ncl``; keys ``limit`` (cuDNN's
``benchmark_limit``; 0 = every kernel; default the server's ``CUDNN_CANDIDATES``), ``benchmark``
(1 / 0: the autotuner on or off), ``frames`` (largest frame bucket: 8 = 1, 2, 4, 8)), joined by
``+`` within one configuration.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

#: ~1-2.5 min each on an H200 (load + capture + pushes): three fit one device call. Measured
#: 2026-12-04 (run13-codec-capture): capture 123.5 s at limit 10, 60.8 at 2, 55.4 at 3, 96.6 at 5;
#: pushes 1.3 % slower at 2-5 than at 10; limit 1 and the autotuner off pick 20x slower kernels.
#: The server now uses ``codec_batch.CUDNN_CANDIDATES`` (3), a config's limit unless it names one.
DEFAULT_CONFIGS = "cl:limit=10,cl,cl:limit=2"
PUSHES = ((1, 1), (16, 4), (64, 4), (128, 4))


def parse_config(text: str) -> dict[str, Any]:
    """``"cl:limit=3+frames=4"`` -> ``{"layout": "channels-last", "limit": 3, "benchmark": True,
    "frames": 4}``; a ValueError names what is wrong."""
    layout, _, rest = text.strip().partition(":")
    layouts = {"cl": "channels-last", "ncl": "ncl"}
    if layout not in layouts:
        raise ValueError(f"config {text!r}: layout must be cl or ncl")
    from ttsfleet.inference.codec_batch import CUDNN_CANDIDATES  # the server's setting unless told

    cfg: dict[str, Any] = {"name": text.strip(), "layout": layouts[layout], "limit": CUDNN_CANDIDATES,
                           "benchmark": True, "frames": 8}
    for item in filter(None, rest.split("+")):
        key, _, value = item.partition("=")
        if key not in ("limit", "benchmark", "frames") or not value.isdigit():
            raise ValueError(f"config {text!r}: {item!r} is not limit=N, benchmark=0|1 or frames=N")
        cfg[key] = bool(int(value)) if key == "benchmark" else int(value)
    return cfg


def measure_one(cfg: dict[str, Any], device: str, tiny: bool) -> dict[str, Any]:
    """Build and capture the serving decoder under ``cfg`` in this process; time it and some pushes."""
    import torch
    from ttsfleet.inference.codec import load_codec
    from ttsfleet.inference.codec_batch import build_slot_decoder
    from ttsfleet.inference.codec_process import DecoderPlan

    cuda = torch.device(device).type == "cuda"
    torch.backends.cudnn.benchmark = cfg["benchmark"]
    torch.backends.cudnn.benchmark_limit = cfg["limit"]
    codec = load_codec("tiny" if tiny else "s2-pro", device=device, fast=cuda and not tiny)
    torch.set_grad_enabled(False)
    slots = 4 if tiny else 128
    plan = DecoderPlan(slots=slots, max_seq_len=4096, graphs=cuda, graph_max_batch=slots, compile_mode=None,
                       max_frames=cfg["frames"], channels_last=cfg["layout"] == "channels-last")
    if cuda:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    decoder = build_slot_decoder(codec, plan)
    if cuda:
        torch.cuda.synchronize()
    capture_s = time.perf_counter() - t0
    graphs = sum(g is not None for g in decoder.graphs.values())
    return {**cfg, "capture_s": round(capture_s, 2), "graphs": graphs,
            "push_ms": _push_times(decoder, codec, cuda, slots)}


def _push_times(decoder: Any, codec: Any, cuda: bool, slots: int) -> dict[str, float]:
    """Median ms of each push shape that fits: graph replays on CUDA (events), whole pushes on the CPU."""
    import statistics

    import torch
    from ttsfleet.inference.bench_engine import replay_ms

    gen = torch.Generator().manual_seed(0)
    out = {}
    for b, t in PUSHES:
        if b > slots:
            continue
        codes = torch.randint(0, 1000 if cuda else 16, (b, codec.num_codebooks, t), generator=gen)
        decoder.push(list(range(b)), codes)  # the graph's inputs hold this push now
        graph = decoder.graphs.get((decoder.bucket(b), t)) if cuda else None
        if graph is not None:
            out[f"{b}x{t}"] = round(replay_ms(graph.graph), 3)
            continue
        times = []
        for _ in range(2):  # the CPU smoke run: whole eager pushes
            t0 = time.perf_counter()
            decoder.push(list(range(b)), codes)
            times.append((time.perf_counter() - t0) * 1000)
        out[f"{b}x{t}"] = round(statistics.median(times), 3)
    return out


def run_all(configs: list[str], device: str, tiny: bool, budget_s: float = 1e9) -> list[dict[str, Any]]:
    """Each configuration in its own process (a fresh autotuner cache); one that fails is reported;
    none starts once ``budget_s`` has passed (a device call's cap)."""
    rows, t0 = [], time.time()
    for text in configs:
        if time.time() - t0 > budget_s:
            rows.append({"name": text, "error": f"not run: {budget_s:.0f} s budget spent"})
            print(_line(rows[-1]), flush=True)
            continue
        cmd = [sys.executable, "-P", __file__, "--one", text, "--device", device]
        cmd += ["--tiny"] if tiny else []
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        last = done.stdout.strip().splitlines()[-1:] if done.stdout.strip() else []
        try:
            row = json.loads(last[0])
        except (IndexError, json.JSONDecodeError):
            tail = done.stderr.strip().splitlines() or ["no output"]
            row = {"name": text, "error": tail[-1][:300]}
        rows.append(row)
        print(_line(row), flush=True)
    return rows


def _line(r: dict[str, Any]) -> str:
    if "error" in r:
        return f"{r['name']:<28} failed: {r['error']}"
    pushes = "  ".join(f"{k} {v:7.3f}" for k, v in r["push_ms"].items())
    return f"{r['name']:<28} capture {r['capture_s']:7.1f} s  {r['graphs']:3d} graphs  push ms: {pushes}"


def main(argv: list[str] | None = None) -> dict[str, Any] | None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("out", nargs="?", help="JSON report path")
    p.add_argument("--configs", default=DEFAULT_CONFIGS, help="comma-separated configurations (module doc)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--tiny", action="store_true", help="the tiny codec in float32 (a CPU smoke run)")
    p.add_argument("--budget-s", type=float, default=1e9, help="start no configuration after these seconds")
    p.add_argument("--one", help=argparse.SUPPRESS)  # the child: one configuration, one JSON line
    args = p.parse_args(argv)
    try:
        configs = [parse_config(c) for c in ([args.one] if args.one else args.configs.split(","))]
    except ValueError as exc:
        p.error(str(exc))
    if args.one:
        print(json.dumps(measure_one(configs[0], args.device, args.tiny)), flush=True)
        return None
    t0 = time.time()
    rows = run_all([c["name"] for c in configs], args.device, args.tiny, args.budget_s)
    report = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "device": args.device,
              "codec": "tiny" if args.tiny else "s2-pro", "rows": rows, "wall_s": round(time.time() - t0, 1)}
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1))
    measured = sum("error" not in r for r in rows)
    print(f"wall {report['wall_s']} s, {measured} of {len(rows)} configurations measured")
    return report


if __name__ == "__main__":
    main()
