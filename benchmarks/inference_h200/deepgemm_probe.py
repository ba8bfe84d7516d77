"""One DeepGEMM FP8 GEMM, loudly: its JIT's compiler output on, Python's fault handler on, each step
printed before it runs, so that a process that dies inside DeepGEMM (2026-12-07d, an H100: call 33t's
``deepgemm_gemm.py`` printed its header and nothing else, exit status unseen) says where.

    DG_JIT_DEBUG=1 python3 -X faulthandler benchmarks/inference_h200/deepgemm_probe.py   # on the device
"""

from __future__ import annotations

import sys

import torch


def step(what: str) -> None:
    print(f"-- {what}", flush=True)


def main() -> int:
    from ttsfleet.kernels.ops import quantize_weight
    from ttsfleet.kernels.reference import linear_fp8_codes_ref, quantize_activation_ref
    from ttsfleet.kernels.testing import rel_err

    step("import deep_gemm")
    import deep_gemm

    step(f"deep_gemm {getattr(deep_gemm, '__version__', '?')} from {deep_gemm.__file__}")
    gen = torch.Generator(device="cuda").manual_seed(26)
    n, k = 2560, 4096
    for m in (16, 1, 64, 128):
        w = torch.randn(n, k, device="cuda", generator=gen) * k ** -0.5
        qw = quantize_weight(w, "bsgemm_fp8")
        x = torch.randn(m, k, device="cuda", generator=gen).to(torch.bfloat16)
        xq, xs = quantize_activation_ref(x, 128)
        out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        step(f"fp8_gemm_nt M={m} N={n} K={k}: scales {tuple(xs.shape)} {xs.dtype} / {tuple(qw.scale.shape)}")
        try:
            deep_gemm.fp8_gemm_nt((xq, xs), (qw.qweight, qw.scale), out)
            torch.cuda.synchronize()
        except Exception as exc:  # noqa: BLE001 - the probe's answer
            step(f"raised {type(exc).__name__}: {str(exc)[:2000]}")
            continue
        err = rel_err(out.float(), linear_fp8_codes_ref(xq, xs, qw, torch.float32))
        step(f"M={m}: done, rel err vs the same-codes reference {err:.2e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
