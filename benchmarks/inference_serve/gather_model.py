"""The codec gather window in the model of :mod:`ttsfleet.inference.codec_gather_sim`: rounds, calls,
frames a call and the listeners' underruns per window, and what one call a round would make.

    PYTHONSAFEPATH=1 python3 benchmarks/inference_serve/gather_model.py --streams 64 --frames 128 \\
        --windows 0,50,100,200 --out benchmarks/inference_serve/gather-model-2026-12-06

Why "one call a round": the rule gathers streams into rounds, but a round makes one codec call per
frame count among its streams (a push decodes the same number of frames for every row), so the
calls — what costs GPU time at the served sizes — fall far less than the rounds. A push that takes
each row's own frame count (a ragged push, padded to the round's longest backlog) would make one
call a round (more only past ``max_frames``); the last columns say what that would leave, padding
counted, in the same model. Counts are real (the codec's counters, the tiny codec
decoding every chunk); the seconds are the model's (``--call-ms`` fixed per call, ``--frame-us`` per
frame: about an H100 push, 2026-12-05c).
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from dataclasses import asdict
from pathlib import Path

import torch
from rich.console import Console
from rich.progress import track
from rich.table import Table
from ttsfleet.inference.bench import machine
from ttsfleet.inference.codec import load_codec
from ttsfleet.inference.codec_gather_sim import SimConfig, SimResult, simulate


def parse(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--streams", type=int, default=64)
    ap.add_argument("--frames", type=int, default=128, help="frames a stream")
    ap.add_argument("--frames-per-s", type=float, default=58.0, help="the engine's frames/s a stream")
    ap.add_argument("--windows", default="0,50,100,200", help="gather windows, ms, comma-separated")
    ap.add_argument("--call-ms", type=float, default=3.0)
    ap.add_argument("--frame-us", type=float, default=30.0)
    ap.add_argument("--out", type=Path, help="folder for result.json and table.txt")
    args = ap.parse_args(argv)
    try:
        args.window_list = [float(w) for w in args.windows.split(",")]
    except ValueError:
        ap.error(f"--windows {args.windows!r}: comma-separated milliseconds, e.g. 0,50,100")
    if args.streams < 1 or args.frames < 1 or min(args.window_list) < 0:
        ap.error("--streams and --frames must be >= 1 and every window >= 0")
    return args


def row(window_ms: float, r: SimResult, cfg: SimConfig) -> dict:
    return {"window_ms": window_ms, **asdict(r), "calls_per_round": round(r.calls_per_round, 2),
            "frames_per_call": round(r.frames_per_call, 1),
            "codec_s": round(cfg.cost_s(r.calls, r.frames), 3),
            "ragged_codec_s": round(cfg.cost_s(r.ragged_calls, r.ragged_frames), 3)}


def table(rows: list[dict]) -> Table:
    t = Table(title="codec gather window, modelled clock (counts real)")
    for col in ("window ms", "rounds", "calls", "calls/round", "frames/call", "underruns", "codec s",
                "ragged push: calls", "frames (padded)", "codec s"):
        t.add_column(col, justify="right")
    for r in rows:
        t.add_row(f"{r['window_ms']:g}", str(r["rounds"]), str(r["calls"]), f"{r['calls_per_round']:.2f}",
                  f"{r['frames_per_call']:.1f}", str(r["underruns"]), f"{r['codec_s']:.2f}",
                  str(r["ragged_calls"]), str(r["ragged_frames"]), f"{r['ragged_codec_s']:.2f}")
    return t


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse(argv)
    torch.set_num_threads(1)
    codec = load_codec("tiny")
    cfg = SimConfig(streams=args.streams, frames=args.frames, frames_per_s=args.frames_per_s,
                    call_s=args.call_ms / 1e3, frame_s=args.frame_us / 1e6)
    windows = track(args.window_list, description="windows")
    rows = [row(w, simulate(codec, cfg, w / 1e3), cfg) for w in windows]
    console = Console(record=True, width=140)
    console.print(table(rows))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        meta = {"date": datetime.date.today().isoformat(), "machine": machine(), "config": asdict(cfg),
                "command": " ".join(["gather_model.py", *argv])}
        (args.out / "result.json").write_text(json.dumps({**meta, "rows": rows}, indent=1) + "\n")
        (args.out / "table.txt").write_text(console.export_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
