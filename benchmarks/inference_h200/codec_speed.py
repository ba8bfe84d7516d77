"""The serving codec on the GPU (S2 size, random weights): push cost, graph capture, and bf16 accuracy.

Measures in one process: ms per batched streaming push (CUDA events, median of 10) for float32 and
bf16, eager and replayed from the bucketed CUDA graphs the engine captures; the time to capture every
bucket x frame count for 128 streams; and what bf16 costs in accuracy: 32 streams x 64 frames of the
same random codes decoded by float32 (TF32 off) and by bf16, as SNR (dB) of the bf16 audio against
the float32 audio, plus graph-replayed bf16 against eager bf16.
Usage on the device: ``python3 -m benchmarks.inference_h200.codec_speed OUT.json``.
"""

from __future__ import annotations

import json
import statistics
import sys
import time

import torch
from ttsfleet.inference.codec import load_codec

SHAPES = ((1, 1), (16, 4), (64, 4), (128, 4), (64, 1))


def push_ms(dec, b: int, t: int, codes: torch.Tensor, reps: int = 10) -> float:  # noqa: ANN001
    slots = list(range(b))
    for _ in range(3):
        dec.push(slots, codes[:b, :, :t])
    times = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        dec.push(slots, codes[:b, :, :t])
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e))
    return statistics.median(times)


def stream(dec, codes: torch.Tensor, step: int = 4) -> torch.Tensor:  # noqa: ANN001
    """Decode ``codes [B, ncb, T]`` in pushes of ``step`` frames; float32 audio ``[B, T * frame]``."""
    slots = list(range(codes.shape[0]))
    for s in slots:
        dec.reset(s)
    parts = [dec.push(slots, codes[:, :, i:i + step]).float().clone() for i in range(0, codes.shape[2], step)]
    return torch.cat(parts, dim=1)


def snr_db(x: torch.Tensor, ref: torch.Tensor) -> float:
    return float(10 * torch.log10(ref.pow(2).sum() / (x - ref).pow(2).sum().clamp_min(1e-30)))


def main() -> None:
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.benchmark = True
    g = torch.Generator().manual_seed(0)
    codes = torch.randint(0, 1000, (128, 10, 64), generator=g)
    report: dict = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "push": []}
    audio = {}
    for name, dtype in (("float32", torch.float32), ("bf16", torch.bfloat16)):
        codec = load_codec("s2-pro", device="cuda", dtype=dtype)
        for graphs in (False, True):
            dec = codec.slot_decoder(128, max_frames=4096, graphs=graphs, graph_max_batch=128)
            if graphs and dtype == torch.bfloat16:  # what serving runs (float32 shapes: on first use)
                t0 = time.perf_counter()
                n = dec.capture((1, 2, 4, 8))
                took = round(time.perf_counter() - t0, 1)
                report[f"capture_{name}"] = {"graphs": n, "buckets": dec.buckets, "s": took}
                print(report[f"capture_{name}"], flush=True)
            for b, t in SHAPES:
                ms = push_ms(dec, b, t, codes)
                report["push"].append({"dtype": name, "graphs": graphs, "streams": b, "frames": t,
                                       "ms": round(ms, 3), "frames_per_s": round(b * t / ms * 1000)})
                print(report["push"][-1], flush=True)
            audio[(name, graphs)] = stream(dec, codes[:32])
            del dec
        del codec
        torch.cuda.empty_cache()
    ref = audio[("float32", False)]
    report["accuracy"] = {
        "bf16_eager_vs_float32_snr_db": round(snr_db(audio[("bf16", False)], ref), 2),
        "bf16_graphs_vs_bf16_eager_snr_db": round(snr_db(audio[("bf16", True)], audio[("bf16", False)]), 2),
        "float32_graphs_vs_eager_max_abs": float((audio[("float32", True)] - ref).abs().max()),
        "bf16_vs_float32_max_abs": float((audio[("bf16", False)] - ref).abs().max()),
        "float32_rms": float(ref.pow(2).mean().sqrt()),
    }
    print(report["accuracy"], flush=True)
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()
