"""The S2 Pro decode step with each built-but-unmeasured lever on and off, side by side (issue #26).

Why one script for several levers: each is a switch that exists (CPU-tested) and waits for its first
H200 figure, and the step is noisy across calls, so they are timed in one process on one model,
alternately, against the default step beside them:

* ``cublas@N``: the GPU catalog sends GEMMs of >= N rows to cuBLAS's block-scaled FP8 kernel
  (``prefill_gemm_min_rows``; on the H200 65 since 2026-12-07f) — decode batches included, in graphs;
* ``topk-torch``: ``TTSFLEET_TOPK_SELECT=torch`` (the sampler's top-k through ``torch.topk``; the
  default, ``kernel``, selects inside the sampler's launch since 2026-12-03b);
* ``fp8kv``: the FP8 KV cache (e4m3 + one exponent per position and KV head);
* ``split@off`` / ``split@N``: decode attention with one program per (row, KV head), or its keys
  shared out among N programs (``TTSFLEET_ATTN_SPLITS``; ``auto``, the default since 2026-12-04,
  is what every other variant runs);
* ``prefetch`` / ``prefetch@N`` / ``prefetch@off``: each FP8 GEMM asks L2 for its first weight
  blocks before it waits for the kernel ahead of it (``TTSFLEET_GEMM_PREFETCH=auto`` / ``N`` blocks
  per program / none; 2 blocks by default since 2026-12-05c, which every variant without a
  ``prefetch`` lever runs); ``kvprefetch`` / ``kvprefetch@N``: decode attention likewise for its
  first K/V blocks (``TTSFLEET_ATTN_PREFETCH``);
* ``ropefused``: the q/k norm + RoPE + KV store inside decode attention's launch
  (``TTSFLEET_ROPE_ATTENTION=fused``: one launch per block fewer);
* ``mlp1``: every FP8 MLP of <= 64 rows in one persistent launch (``TTSFLEET_MLP_LAUNCH=one``: the
  down weights prefetched into L2 while gate_up runs; 76 MLPs per frame); ``fastattn1``: the fast
  model's QKV GEMM, RoPE + store, attention and O GEMM in one launch (``TTSFLEET_FAST_ATTN_LAUNCH=one``;
  40 per frame);
* ``scalesdirect``: the fused RMSNorm and decode attention write their FP8 codes' scales in cuBLAS's
  outer-dim-major order where the GEMM reading them goes to cuBLAS (``TTSFLEET_CUBLAS_SCALES=direct``:
  three scale copies per layer pass fewer at batches of 65+ rows on an H200);
* ``head32``: the sampling heads' float32 GEMM (``TTSFLEET_HEAD_GEMM=float32``, the default until
  2026-12-05, when ``headbf16`` — cuBLAS's bf16 GEMM with float32 output, the same products, half
  the bytes — timed 0.95-0.98x the step and became the default; ``headbf16`` names the default);
* ``tile@WxK``: decode attention launched with W warps and K keys per block (``TTSFLEET_ATTN_TILE``;
  ``4x64`` the default, ``8x32`` the one without register spills on sm_90);
* ``table@FILE``: every GEMM launch config of a tuned table (a fresh sweep's ``tuned_h200.json``)
  pinned over the shipped ``kernels/tuned_h200.json`` (``triton_gemm.pin_table``): the step on
  the new picks beside the old (``speed_run.sh sweep`` runs the sweep, then this);
* ``a16``: the W8A16 decode GEMM prototype for every decode linear (``TTSFLEET_DECODE_GEMM=a16``:
  bf16 activations, FP8 weights widened in the tile; the MLP as gate_up with a bf16 SwiGLU epilogue,
  then down);
* ``deepgemm``: every decode linear's FP8 codes through DeepGEMM (``TTSFLEET_DECODE_GEMM=deepgemm``,
  ``kernels/deepgemm_fp8.py``; ``deep_gemm`` must import: ``speed_run.sh deepgemm`` builds it);
  ``deepgemm@LO-HI``: only GEMMs of LO..HI rows (``TTSFLEET_DEEPGEMM_ROWS``), the rest ours;
  ``deepgemm@LO-HI@NxK:NxK``: and only those weight shapes (``TTSFLEET_DEEPGEMM_SHAPES``);
* levers joined by ``+`` run together (``fp8kv+split``: the FP8 cache's slower key loop spread
  over more programs).

Each variant replays the whole decode step from a CUDA graph on a cache filled to 576 positions
(as ``step_bench.py``); rounds alternate the variants so drift hits all alike. Prints a table of
medians (ms per step) and the ratio to the default; JSON to ``$OUT/decode_levers.json``.

    python3 -m benchmarks.inference_h200.decode_levers            # on the device, from the repo root
    LEVER_BATCHES=1,8,32,64,128 LEVER_ROUNDS=3 (defaults)
    LEVER_CONTEXT=4096 LEVER_VARIANTS=default,fp8kv   # the FP8 cache where K/V dominate the bytes
    LEVER_CONTEXT=4096 LEVER_VARIANTS=default,split,split@4,fp8kv,fp8kv+split   # long contexts
    LEVER_VARIANTS=default,tile@8x32,tile@8x64,split@off+tile@8x32   # the attention launch tile
    LEVER_VARIANTS=default,prefetch@off,prefetch@4,kvprefetch,kvprefetch+prefetch@off   # prefetch into L2
    LEVER_VARIANTS=default,ropefused,ropefused+prefetch+kvprefetch   # RoPE inside attention
    LEVER_VARIANTS=default,head32   # the heads' float32 GEMM (the default until 2026-12-05)
    LEVER_VARIANTS=default,mlp1,fastattn1,mlp1+fastattn1,mlp1+fastattn1+prefetch   # one-launch kernels
    LEVER_VARIANTS=default,a16   # the W8A16 decode GEMM prototype (issue #26)
    LEVER_VARIANTS=default,deepgemm   # DeepGEMM for the decode GEMMs (issue #26)
    LEVER_VARIANTS=default,deepgemm,deepgemm@16-128   # ... and only from 16 rows up
    LEVER_VARIANTS=default,deepgemm@1-128@6144x2560:2560x4096   # ... for qkv and o only (S2 Pro)
"""

from __future__ import annotations

import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

import torch

BATCHES = [int(v) for v in os.environ.get("LEVER_BATCHES", "1,8,32,64,128").split(",")]
ROUNDS = int(os.environ.get("LEVER_ROUNDS", "3"))
CUBLAS_ROWS = [int(v) for v in os.environ.get("LEVER_CUBLAS_ROWS", "16,64").split(",")]
#: Positions in the cache each step attends over (576: a 512-token prompt plus 64 frames).
CONTEXT = int(os.environ.get("LEVER_CONTEXT", "576"))
VARIANTS = [v for v in os.environ.get("LEVER_VARIANTS", "").split(",") if v]


def _fill(cache: Any) -> None:
    """Random K/V (finite codes for an FP8 cache) and pending state, seeded."""
    g = torch.Generator(device=cache.k.device).manual_seed(0)
    for t in (cache.k, cache.v):
        if t.dtype == torch.float8_e4m3fn:
            t.view(torch.uint8).copy_(torch.randint(0, 0x7E, t.shape, device=t.device, generator=g,
                                                    dtype=torch.uint8))
        else:
            t.normal_(generator=g)
    cache.pending_logits.normal_(generator=g)
    cache.pending_hidden.normal_(generator=g)


def _step_ms(model: Any, cache: Any, bs: int) -> float:
    """Median ms of one decode step at ``bs`` rows, replayed from a CUDA graph."""
    from ttsfleet.inference.bench_engine import decode_inputs, decode_step_fn, graph_replay_ms

    return graph_replay_ms(decode_step_fn(model, cache, CONTEXT, decode_inputs(model, bs)))


def _kv_kind(name: str) -> str:
    """The cache a variant decodes from: ``fp8`` for ``fp8kv`` alone or in a combination."""
    return "fp8" if "fp8kv" in name.split("+") else "auto"


def _variant(name: str) -> dict[str, Any]:
    """Switch the process to variant ``name`` (levers joined by ``+`` combine, e.g.
    ``fp8kv+split``); returns its cache kind."""
    from ttsfleet.inference import model_layers
    from ttsfleet.kernels import decode, dispatch, triton_gemm

    from ttsfleet.catalog import GpuCatalog

    parts = name.split("+")
    split = next((p for p in parts if p.startswith("split")), None)
    cublas = next((p for p in parts if p.startswith("cublas@")), None)
    decode.set_topk_select("torch" if "topk-torch" in parts else "kernel")
    decode.set_attn_splits((split.partition("@")[2] or "auto") if split else "auto")
    prefetch = next((p for p in parts if p.startswith("prefetch")), None)
    default_prefetch = decode.GEMM_PREFETCH_SWITCH.default
    decode.set_gemm_prefetch((prefetch.partition("@")[2] or "auto") if prefetch else default_prefetch)
    kv_prefetch = next((p for p in parts if p.startswith("kvprefetch")), None)
    decode.set_attn_prefetch((kv_prefetch.partition("@")[2] or "auto") if kv_prefetch else "off")
    decode.set_rope_attention("fused" if "ropefused" in parts else "separate")
    decode.set_mlp_launch("one" if "mlp1" in parts else "two")
    decode.set_fast_attn_launch("one" if "fastattn1" in parts else "separate")
    decode.set_cublas_scales("direct" if "scalesdirect" in parts else "copy")
    gemm = next((p for p in parts if p == "a16" or p.startswith("deepgemm")), "fp8")
    gemm_name, rows, shapes = (gemm.split("@") + ["", ""])[:3]
    decode.set_decode_gemm(gemm_name)
    decode.set_deepgemm_rows(rows or decode.DEEPGEMM_ROWS_SWITCH.default)
    decode.set_deepgemm_shapes(shapes.replace(":", ",") or decode.DEEPGEMM_SHAPES_SWITCH.default)
    model_layers.set_head_gemm("float32" if "head32" in parts else "bf16")
    table = next((p for p in parts if p.startswith("table@")), None)
    triton_gemm.pin_table(json.loads(Path(table.partition("@")[2]).read_text()) if table else None)
    tile = next((p for p in parts if p.startswith("tile@")), "tile@4x64")
    decode.set_attn_tile(tile.partition("@")[2])
    if cublas:
        base = GpuCatalog.default()
        h200 = base.classes["h200"].model_copy(update={"prefill_gemm_min_rows": int(cublas.split("@")[1])})
        dispatch.use_catalog(base.model_copy(update={"classes": {**base.classes, "h200": h200}}))
    else:
        dispatch.use_catalog(None)
    return {"kv": _kv_kind(name)}


def main() -> None:
    from ttsfleet.inference.loader import load_model
    from ttsfleet.kernels import dispatch

    t0 = time.time()
    model = load_model("s2-pro", device="cuda", dtype=torch.bfloat16, quantize="auto",
                       max_seq_len=max(1024, CONTEXT + 64))
    variants = VARIANTS or ["default", "head32", "prefetch@2", "prefetch@4", "kvprefetch", "ropefused",
                            "ropefused+prefetch@2", *[f"cublas@{r}" for r in CUBLAS_ROWS]]
    if "default" not in variants:
        variants.insert(0, "default")  # every ratio is to the default beside it
    kinds = {_kv_kind(v) for v in variants}
    caches = {kv: model.new_cache(max(BATCHES), CONTEXT + 4, kv_dtype=kv) for kv in kinds}
    for cache in caches.values():
        _fill(cache)
    print(f"{torch.cuda.get_device_name(0)}; loaded in {time.time() - t0:.0f} s; plan "
          f"{dispatch.plan('cuda').reason}", flush=True)
    times: dict[str, dict[int, list[float]]] = {v: {b: [] for b in BATCHES} for v in variants}
    errors: dict[str, str] = {}
    for rnd in range(ROUNDS):
        order = variants if rnd % 2 == 0 else variants[::-1]
        for name in order:
            if name in errors:
                continue
            kv = _variant(name)["kv"]
            try:
                for bs in BATCHES:
                    times[name][bs].append(_step_ms(model, caches[kv], bs))
            except Exception as exc:  # noqa: BLE001 - one lever failing must not lose the others
                errors[name] = f"{type(exc).__name__}: {exc}"[:300]
                print(f"{name}: {errors[name]}", flush=True)
        print(f"round {rnd + 1}/{ROUNDS} done at {time.time() - t0:.0f} s", flush=True)
    _variant("default")
    rows = []
    for name in variants:
        for bs in BATCHES:
            v = times[name][bs]
            if not v:
                continue
            med = statistics.median(v)
            base = statistics.median(times["default"][bs]) if times["default"][bs] else float("nan")
            rows.append({"variant": name, "batch": bs, "step_ms": round(med, 4),
                         "min_ms": round(min(v), 4), "max_ms": round(max(v), 4),
                         "vs_default": round(med / base, 3), "frames_per_s": round(bs / med * 1e3, 1)})
    res = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "device": torch.cuda.get_device_name(0),
           "torch": torch.__version__, "context": CONTEXT, "rounds": ROUNDS, "rows": rows, "errors": errors,
           "timing": "CUDA-graph replay of decode_step, median of 20 replays per round; per variant the "
                     "median over rounds (variants alternate, order reversed every other round)"}
    with open(os.path.join(os.environ.get("OUT", "/tmp"), "decode_levers.json"), "w") as fh:
        json.dump(res, fh, indent=1)
    print(f"{'variant':<12} {'bs':>4} {'step ms':>8} {'min-max':>15} {'x default':>9} {'frames/s':>9}")
    for r in rows:
        spread = f"{r['min_ms']:7.3f}-{r['max_ms']:<7.3f}"
        print(f"{r['variant']:<12} {r['batch']:>4} {r['step_ms']:8.3f} {spread} {r['vs_default']:9.3f} "
              f"{r['frames_per_s']:9.1f}")


if __name__ == "__main__":
    main()
