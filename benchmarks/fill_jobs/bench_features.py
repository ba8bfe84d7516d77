"""The features stage on CPU and (when present) CUDA: equality and speed.

Runs :class:`ttsfleet.fill_jobs.features.LogMel` on 40 synthetic clips (2.7 min of audio) on each
device, checks that CUDA's log-mels equal the CPU's within 1e-3, and prints the speed. Needs only
numpy and torch (no pydantic), so it also runs on a bare GPU machine with
``PYTHONPATH`` pointing at a tree where ``ttsfleet/fill_jobs`` is importable.

    python benchmarks/fill_jobs/bench_features.py [--record]
"""

from __future__ import annotations

import argparse
import datetime as dt
import platform
import time
import types
from pathlib import Path

import numpy as np
import torch
from ttsfleet.fill_jobs.features import LogMel

RESULTS = Path(__file__).with_name("RESULTS.md")
CFG = types.SimpleNamespace(target_rate=24000, n_fft=1024, hop_length=256, n_mels=80,
                            feature_batch_size=16, feature_device="auto")


def clips() -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    t = np.arange(24000 * 6) / 24000
    spec = [(220, 1.3), (440, 2.0), (1000, 3.7), (3000, 0.5), (150, 5.9)] * 8
    return [(0.3 * np.sin(2 * np.pi * f * t[: int(24000 * d)])
             + 0.01 * rng.standard_normal(int(24000 * d))).astype(np.float32) for f, d in spec]


def timed(device: str, data: list[np.ndarray], repeats: int = 5) -> tuple[list[np.ndarray], float]:
    m = LogMel(CFG, device=device)
    out = m(data)  # warm-up (CUDA context, FFT plans)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(repeats):
        m(data)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return out, (time.perf_counter() - t0) / repeats


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--record", action="store_true", help="append the result to RESULTS.md")
    args = ap.parse_args()
    data = clips()
    audio_s = sum(len(c) for c in data) / CFG.target_rate
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    results = {d: timed(d, data) for d in devices}
    gpu_name = torch.cuda.get_device_name(0) if "cuda" in results else "none"
    lines = [f"\n## features stage {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC — {platform.node()}, "
             f"GPU {gpu_name}, torch {torch.__version__}\n",
             f"{len(data)} clips, {audio_s:.0f} s of audio, 80 log-mels, batch {CFG.feature_batch_size}.\n",
             "| device | ms per pass | x real time | max abs diff vs CPU |", "|---|---|---|---|"]
    cpu_out = results["cpu"][0]
    for dev, (out, secs) in results.items():
        diff = max(float(np.max(np.abs(a - b))) for a, b in zip(cpu_out, out, strict=True))
        lines.append(f"| {dev} | {secs * 1000:.1f} | {audio_s / secs:.0f} | {diff:.2e} |")
        if dev != "cpu":
            assert diff < 1e-3, f"{dev} differs from CPU by {diff}"
    print("\n".join(lines))
    if args.record:
        with open(RESULTS, "a", encoding="utf-8") as fh:
            fh.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
