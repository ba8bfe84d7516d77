"""Time the parts the engine calls per step — model.decode_step, SamplingBatch.from_params, codec push.

Why: when the served frames/s are low, this separates the engine's own overhead from the model's
and the codec's. Usage: ``python benchmarks/inference_serve/profile_parts.py [cuda|cpu]``.
"""

from __future__ import annotations

import sys
import time

import torch
from ttsfleet.inference.codec import load_codec
from ttsfleet.inference.loader import load_model
from ttsfleet.inference.prompt import build_prompt
from ttsfleet.inference.sampling import SamplingBatch, SamplingParams
from ttsfleet.inference.tokenizer import load_tokenizer


def main(dev: str) -> None:
    dtype = torch.bfloat16 if dev == "cuda" else torch.float32
    model = load_model("tiny", device=dev, dtype=dtype)
    codec = load_codec("tiny", device=dev)
    prompt = build_prompt(load_tokenizer("tiny"), model.config, "Profile this.").to(dev)

    def sync() -> None:
        if dev == "cuda":
            torch.cuda.synchronize()

    n = 20
    for bs in (1, 16, 64):
        cache = model.new_cache(bs, 512)
        for slot in range(bs):
            model.prefill(cache, slot, prompt)
        slots = torch.arange(bs, device=dev)
        window = torch.full((bs, 16, model.config.num_codebooks), -1, dtype=torch.int32, device=dev)
        params = [SamplingParams(seed=i) for i in range(bs)]
        batch = SamplingBatch.from_params(params, dev)
        for _ in range(3):
            model.decode_step(cache, slots, batch, window)
        sync()
        t = time.perf_counter()
        for _ in range(n):
            model.decode_step(cache, slots, batch, window).cpu()
        print(f"decode_step bs={bs}: {(time.perf_counter() - t) / n * 1000:.1f} ms", flush=True)
        t = time.perf_counter()
        for _ in range(n):
            SamplingBatch.from_params(params, dev)
        print(f"  from_params bs={bs}: {(time.perf_counter() - t) / n * 1000:.2f} ms", flush=True)
    codes = torch.randint(0, 16, (model.config.num_codebooks, 64))
    codes[0] = torch.randint(0, 64, (64,))
    for k in (1, 4, 16):
        stream = codec.stream_decoder()
        stream.push(codes[:, :k])
        sync()
        t = time.perf_counter()
        pushes = 0
        for i in range(k, 64 - k, k):
            stream.push(codes[:, i:i + k])
            pushes += 1
        print(f"codec push of {k} frames: {(time.perf_counter() - t) / pushes * 1000:.1f} ms", flush=True)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "cuda")
