"""Where a batched streaming codec push spends GPU time (S2 size, random weights), per dtype.

Run on the device from the repo root: ``python3 -m benchmarks.inference_h200.codec_profile OUTDIR``.
Prints ms per 64 x 4 push (CUDA events, median of 10 after warm-up) for float32 (TF32 off), TF32,
bf16, and the bf16 push's top CUDA kernels (torch.profiler), to choose what to fuse first.
"""

from __future__ import annotations

import json
import sys

import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile
from ttsfleet.inference.codec import load_codec


def push_ms(codec, b: int, t: int, reps: int = 10) -> tuple[float, object]:
    dec = codec.slot_decoder(b, max_frames=4096)
    gen = torch.Generator().manual_seed(0)
    codes = torch.randint(0, 1000, (b, codec.num_codebooks, t), generator=gen)
    slots = list(range(b))
    for _ in range(3):
        dec.push(slots, codes)
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        dec.push(slots, codes)
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e))
    return float(np.median(times)), dec


def main() -> None:
    out = sys.argv[1] if len(sys.argv) > 1 else "."
    rows = []
    for name, dtype, tf32 in (("float32", torch.float32, False), ("tf32", torch.float32, True),
                              ("bf16", torch.bfloat16, True)):
        torch.backends.cudnn.allow_tf32 = tf32
        torch.backends.cuda.matmul.allow_tf32 = tf32
        codec = load_codec("s2-pro", device="cuda", dtype=dtype)
        for b, t in ((64, 4), (16, 4), (1, 1)):
            ms, dec = push_ms(codec, b, t)
            rows.append({"dtype": name, "streams": b, "frames": t, "ms": ms})
            print(f"{name:8} B={b:3} T={t}: {ms:8.2f} ms", flush=True)
        if name == "bf16":
            dec = codec.slot_decoder(64, max_frames=4096)
            codes = torch.randint(0, 1000, (64, codec.num_codebooks, 4))
            for _ in range(3):
                dec.push(list(range(64)), codes)
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
                for _ in range(3):
                    dec.push(list(range(64)), codes)
                torch.cuda.synchronize()
            table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=40)
            print(table)
            with open(f"{out}/codec_profile_bf16.txt", "w") as f:
                f.write(table)
        del codec
        torch.cuda.empty_cache()
    with open(f"{out}/codec_push_dtypes.json", "w") as f:
        meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
        json.dump({**meta, "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
