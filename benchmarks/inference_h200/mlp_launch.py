"""The S2 Pro FP8 SwiGLU MLP in two launches and in one, side by side on one GPU (issue #26).

Why: the issue's target is the fused MLP at <= 24 us at M=1 (two launches: 33.6 us against a 17.6 us
weight floor, 2026-12-01); the one-launch kernel (``TTSFLEET_MLP_LAUNCH=one``,
``kernels/triton_mlp.py``) was built without a GPU. Before timing, each M checks the one launch
against two launches with its own tiles (bit for bit: the same tile code) and against the torch
reference, so a wrong kernel is never timed. Then, per M, CUDA-graph replays (``kernels.bench``'s
method: enough weight copies cycled that nothing is served from L2) of:

* ``two``: the default two launches (the tuned configs), with ``TTSFLEET_GEMM_PREFETCH`` off and auto;
* ``one``: one launch, the down weights prefetched into L2 while gate_up runs (auto), and with no
  prefetch (what the prefetch itself buys).

Rounds alternate the variants; the table gives medians (us), the spread (max-min over median) and
the weight floor at the measured copy bandwidth. JSON to ``$OUT/mlp_launch.json``.

    python3 -m benchmarks.inference_h200.mlp_launch     # on the device, from the repo root
    MLP_MS=1,8,16,32,64 MLP_ROUNDS=5 (defaults)
"""

from __future__ import annotations

import json
import os
import statistics
import time
from functools import partial
from typing import Any

import torch

MS = [int(v) for v in os.environ.get("MLP_MS", "1,8,16,32,64").split(",")]
ROUNDS = int(os.environ.get("MLP_ROUNDS", "5"))


def _check(m: int, xq: torch.Tensor, xs: torch.Tensor, gu: Any, dn: Any) -> dict[str, Any]:
    """One launch vs two launches with its tiles (bits) and vs the reference (relative error)."""
    from ttsfleet.kernels import triton_gemm as tg
    from ttsfleet.kernels import triton_mlp as tm
    from ttsfleet.kernels.reference import swiglu_mlp_fp8_codes_ref
    from ttsfleet.kernels.testing import rel_err

    plan = tm.one_launch_plan(m, xq.shape[1], gu.shape[0] // 2, 128, tm._sms(xq.device))
    got = tm.swiglu_mlp_one_launch(xq, xs, gu, dn, torch.bfloat16)
    hq = torch.empty(m, gu.shape[0] // 2, device="cuda", dtype=torch.float8_e4m3fn)
    hs = torch.empty(m, gu.shape[0] // 2 // 128, device="cuda", dtype=torch.float32)
    common = dict(swap=True, num_warps=plan.num_warps, num_stages=3, tma=True)
    gate_up = tg.GemmConfig(bn=128, split_k=plan.gu_split, **common)
    tg.launch_gemm(xq, xs, gu, hq, None, gate_up, epi=1, h_scale=hs)
    two = torch.empty_like(got)
    tg.launch_gemm(hq, hs, dn, two, None, tg.GemmConfig(bn=plan.dn_bn, split_k=plan.dn_split, **common))
    ref = swiglu_mlp_fp8_codes_ref(xq.cpu(), xs.cpu(), gu.to("cpu"), dn.to("cpu"), torch.bfloat16)
    again = tm.swiglu_mlp_one_launch(xq, xs, gu, dn, torch.bfloat16)
    return {"plan": plan.__dict__, "bits_equal_two_launches": bool(torch.equal(got, two)),
            "replay_equal": bool(torch.equal(got, again)), "rel_err_vs_reference": rel_err(got, ref)}


def _variants(xq: torch.Tensor, xs: torch.Tensor, gus: list, dns: list) -> dict[str, list]:
    from ttsfleet.kernels import decode
    from ttsfleet.kernels import triton_mlp as tm
    from ttsfleet.kernels.ops import swiglu_mlp_fp8_codes

    pairs = list(zip(gus, dns, strict=True))

    def two(prefetch: str) -> list:
        decode.set_gemm_prefetch(prefetch)  # read at launch: the graph captures its launches
        return [partial(swiglu_mlp_fp8_codes, xq, xs, a, b, torch.bfloat16) for a, b in pairs]

    def one(prefetch: int | None) -> list:
        return [partial(tm.swiglu_mlp_one_launch, xq, xs, a, b, torch.bfloat16, prefetch=prefetch)
                for a, b in pairs]

    return {"two": lambda: two("off"), "two+prefetch": lambda: two("auto"), "one": lambda: one(None),
            "one@noprefetch": lambda: one(0)}


def main() -> None:
    from ttsfleet.kernels import decode
    from ttsfleet.kernels.bench import INTER, H, _mlp_weights_fp8, copy_bandwidth, graph_us
    from ttsfleet.kernels.ops import quantize_activation

    out_dir = os.environ.get("OUT", ".")
    bw = copy_bandwidth()
    gus, dns = _mlp_weights_fp8()
    floor = 3 * H * INTER / bw * 1e6
    result: dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M:%S"), "gpu": torch.cuda.get_device_name(),
                              "copy_bw_gbs": bw / 1e9, "floor_us": floor, "copies": len(gus), "rows": []}
    print(f"{result['gpu']}  copy {bw / 1e9:.0f} GB/s  MLP weight floor {floor:.1f} us", flush=True)
    for m in MS:
        xq, xs = quantize_activation(torch.randn(m, H, device="cuda", dtype=torch.bfloat16))
        row: dict[str, Any] = {"M": m, "check": _check(m, xq, xs, gus[0], dns[0]), "us": {}}
        variants = _variants(xq, xs, gus, dns)
        times: dict[str, list[float]] = {name: [] for name in variants}
        for _ in range(ROUNDS):
            for name, calls in variants.items():
                times[name].append(graph_us(calls()))
        decode.GEMM_PREFETCH_SWITCH.reset()
        for name, ts in times.items():
            med = statistics.median(ts)
            row["us"][name] = {"median": med, "spread": (max(ts) - min(ts)) / med, "all": ts}
        result["rows"].append(row)
        cells = "  ".join(f"{n} {v['median']:6.2f} ({100 * v['spread']:.0f}%)" for n, v in row["us"].items())
        print(f"M={m:3d}  {cells}  | one/two {row['us']['one']['median'] / row['us']['two']['median']:.3f}  "
              f"check {row['check']['bits_equal_two_launches']} {row['check']['rel_err_vs_reference']:.4f}",
              flush=True)
    with open(os.path.join(out_dir, "mlp_launch.json"), "w") as fh:
        json.dump(result, fh, indent=1)


if __name__ == "__main__":
    main()
