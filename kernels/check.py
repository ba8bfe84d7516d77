"""Correctness checks on the current device, for ``ttsfleet kernels check`` (and the GPU tests).

Each check draws fresh random inputs, runs the public op on the device (Triton on sm_90, the
reference elsewhere), and compares with float64 math on the CPU: against the *same FP8 codes*
(tight: catches indexing, scale-stride and split-K bugs) and, for the MLP, against unquantized
float64 (loose: catches a wrong quantization format). Outputs are poisoned with NaN first.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from . import dispatch
from .layout import QuantizedWeight
from .ops import linear_fp8, quantize_activation, quantize_weight, swiglu_mlp_fp8
from .reference import (
    act_block,
    dequantize_activation,
    dequantize_weight,
    quantize_activation_ref,
)
from .testing import TOL_MLP_VS_UNQUANTIZED, TOL_SAME_CODES_BF16, randn, rel_err
from .window import prev_tokens_shift_


@dataclass
class CheckResult:
    name: str
    backend: str
    shape: str
    error: float
    tol: float

    @property
    def ok(self) -> bool:
        return self.error <= self.tol


def poison_allocator(device: torch.device, nbytes: int) -> None:
    """Fill then free a NaN block so the caching allocator hands NaN memory to the next outputs."""
    if device.type == "cuda":
        t = torch.empty(nbytes // 4 + 1, dtype=torch.float32, device=device).fill_(float("nan"))
        del t


def f64_same_codes(x: torch.Tensor, qw: QuantizedWeight) -> torch.Tensor:
    xc = x.reshape(-1, x.shape[-1]).cpu()
    xq, xs = quantize_activation_ref(xc, act_block(qw.scheme))
    wq = QuantizedWeight(qw.qweight.cpu(), qw.scale.cpu(), qw.scheme, qw.shape)
    return dequantize_activation(xq, xs).double() @ dequantize_weight(wq).double().t()


def check_linear(gen: torch.Generator, dev: torch.device, scheme: str, m: int, n: int, k: int) -> CheckResult:
    w = randn(gen, n, k, scale=k ** -0.5, device=dev)
    qw = quantize_weight(w, scheme)
    x = randn(gen, m, k, device=dev, dtype=torch.bfloat16)
    poison_allocator(dev, m * n * 2 * 4)
    out = linear_fp8(x, qw)
    return CheckResult(f"linear_fp8 {scheme}", dispatch.backend_name(x), f"M={m} N={n} K={k}",
                       rel_err(out, f64_same_codes(x, qw)), TOL_SAME_CODES_BF16)


def check_quant(gen: torch.Generator, dev: torch.device, block: int, m: int, k: int) -> CheckResult:
    """Codes and scales must equal the reference bit for bit: error = fraction of mismatching bytes."""
    x = randn(gen, m, k, scale=3.0, device=dev, dtype=torch.bfloat16)
    poison_allocator(dev, m * k * 8)
    q, s = quantize_activation(x, block)
    rq, rs = quantize_activation_ref(x.cpu(), block)
    bad = (q.cpu().view(torch.uint8) != rq.view(torch.uint8)).float().mean()
    bad_s = (s.cpu().view(torch.uint8) != rs.view(torch.uint8)).float().mean()
    return CheckResult(f"quantize_activation 1x{block}", dispatch.backend_name(x), f"M={m} K={k}",
                       float(bad + bad_s), 0.0)


def check_mlp(gen: torch.Generator, dev: torch.device, scheme: str, m: int, d: int, f: int) -> CheckResult:
    w1, w3 = randn(gen, f, d, scale=d ** -0.5), randn(gen, f, d, scale=d ** -0.5)
    w2 = randn(gen, d, f, scale=f ** -0.5)
    gu = quantize_weight(torch.cat([w1, w3]).to(dev), scheme)
    dn = quantize_weight(w2.to(dev), scheme)
    x = randn(gen, m, d, device=dev, dtype=torch.bfloat16)
    poison_allocator(dev, m * (d + 2 * f) * 4)
    out = swiglu_mlp_fp8(x, gu, dn)
    xd = x.double().cpu()
    gud = dequantize_weight(gu.to("cpu")).double()
    h = torch.nn.functional.silu(xd @ gud[:f].t()) * (xd @ gud[f:].t())
    ref = h @ dequantize_weight(dn.to("cpu")).double().t()
    return CheckResult(f"swiglu_mlp_fp8 {scheme}", dispatch.backend_name(x), f"M={m} D={d} F={f}",
                       rel_err(out, ref), TOL_MLP_VS_UNQUANTIZED)


def check_window(gen: torch.Generator, dev: torch.device, bs: int, w: int, cw: int) -> CheckResult:
    """Error = fraction of window elements differing from the reference after several steps."""
    prev = torch.randint(-(2**31), 2**31 - 1, (bs, w, cw), generator=gen, dtype=torch.int64).to(torch.int32)
    ref = prev.clone()
    prev = prev.to(dev)
    for _ in range(3):
        nxt = torch.randint(0, 4096, (bs, cw), generator=gen, dtype=torch.int32)
        prev_tokens_shift_(prev, nxt.to(dev))
        ref = torch.cat([ref[:, 1:], nxt[:, None]], dim=1)
    bad = (prev.cpu() != ref).float().mean()
    shape = f"bs={bs} W={w} cw={cw}"
    return CheckResult("prev_tokens_shift_", dispatch.backend_name(prev), shape, float(bad), 0.0)


def run_checks(device: str | None = None, quick: bool = False) -> list[CheckResult]:
    """The standard battery: odd shapes (M=1, M not a multiple of 4, N off the 128 grid)."""
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    seed = int.from_bytes(os.urandom(4), "little")
    gen = torch.Generator().manual_seed(seed)
    res: list[CheckResult] = []
    lin = [(1, 256, 512), (3, 200, 384), (17, 320, 1000)] if quick else \
        [(1, 6144, 2560), (7, 2560, 4096), (33, 200, 384), (64, 19456, 2560), (130, 2560, 9728)]
    for scheme in ("bsgemm_fp8", "mxfp8"):
        for m, n, k in lin:
            res.append(check_linear(gen, dev, scheme, m, n, k))
        for m in ((1, 5) if quick else (1, 5, 64)):
            d, f = (256, 384) if quick else (2560, 9728)
            res.append(check_mlp(gen, dev, scheme, m, d, f))
    for block in (128, 32):
        res.append(check_quant(gen, dev, block, 5, 1000))
    res.append(check_window(gen, dev, 4, 8, 10))
    res.append(check_window(gen, dev, 2, 300, 9))
    return res


def format_table(results: list[CheckResult]) -> str:
    lines = [f"{'check':28s} {'backend':9s} {'shape':22s} {'error':>9s} {'tol':>8s}  ok"]
    for r in results:
        lines.append(f"{r.name:28s} {r.backend:9s} {r.shape:22s} {r.error:9.2e} {r.tol:8.1e}  "
                     f"{'PASS' if r.ok else 'FAIL'}")
    return "\n".join(lines)
