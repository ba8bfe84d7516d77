"""Prefill cost at S2 Pro shape on the GPU: GEMM configs for M > 128 and prompt chunk sizes.

Why: the engine bench showed a 512-token prefill at ~60 ms, which at 64 concurrent requests costs
more GPU time than their decoding. The FP8 GEMM kernel is tuned for decode (M <= 128); prefill uses
one untuned config. This times ``model.prefill`` of a 512-token prompt under candidate configs (and
checks each gives the default config's logits) and under chunked prefill at the default config.
Usage: ``python3 benchmarks/inference_h200/prefill_configs.py`` (prints a table, writes JSON to $OUT).
"""

from __future__ import annotations

import json
import os
import statistics
import time

import torch
from ttsfleet.inference.loader import load_model
from ttsfleet.kernels import triton_gemm as tg

SHAPES = {"linear": [(6144, 2560), (2560, 4096)], "swiglu": [(19456, 2560)], "down": [(2560, 9728)]}
CANDIDATES = {
    "default": None,
    "bn128_bm64_swap": tg.GemmConfig(bn=128, split_k=1, swap=True, num_warps=8, num_stages=3, bm=64),
    "bn128_bm128": tg.GemmConfig(bn=128, split_k=1, swap=False, num_warps=8, num_stages=3, bm=128),
    "bn64_bm128": tg.GemmConfig(bn=64, split_k=1, swap=False, num_warps=4, num_stages=4, bm=128),
}


def pin(cfg: tg.GemmConfig | None, m: int) -> None:
    for kind, shapes in SHAPES.items():
        for n, k in shapes:
            tg.set_config(kind, m, n, k, cfg)


def prefill_ms(model, cache, prompt, chunk: int, reps: int = 5) -> float:  # noqa: ANN001
    times = []
    for _ in range(reps + 1):
        torch.cuda.synchronize()
        t = time.perf_counter()
        for start in range(0, prompt.shape[1], chunk):
            model.prefill(cache, 0, prompt[:, start:start + chunk], start=start)
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t) * 1000)
    return statistics.median(times[1:])


def main() -> None:
    model = load_model("s2-pro", device="cuda", dtype=torch.bfloat16, quantize="auto", max_seq_len=1024)
    c = model.config
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, c.semantic_begin_id - 1000, (512,), generator=g)
    prompt = torch.cat([ids[None], torch.zeros(c.num_codebooks, 512, dtype=torch.int64)]).cuda()
    cache = model.new_cache(2, 1024)
    rows, ref = [], None
    for name, cfg in CANDIDATES.items():
        pin(cfg, 512)
        try:
            ms = prefill_ms(model, cache, prompt, 512)
            logits = cache.pending_logits[0].clone()
            if ref is None:
                ref = logits
            err = float((logits - ref).abs().max() / ref.abs().max())
            rows.append({"variant": name, "chunk": 512, "ms": round(ms, 2), "rel_err_vs_default": err})
        except Exception as exc:  # a config the compiler rejects: report it, keep going
            rows.append({"variant": name, "chunk": 512, "error": f"{type(exc).__name__}: {exc}"[:200]})
        pin(None, 512)
        print(rows[-1], flush=True)
    for chunk in (64, 128, 256):
        ms = prefill_ms(model, cache, prompt, chunk)
        rows.append({"variant": "default", "chunk": chunk, "ms": round(ms, 2)})
        print(rows[-1], flush=True)
    out = os.environ.get("OUT", "/tmp")
    with open(os.path.join(out, "prefill_configs.json"), "w") as fh:
        json.dump({"device": torch.cuda.get_device_name(0), "prompt_tokens": 512, "rows": rows}, fh, indent=2)


if __name__ == "__main__":
    main()
