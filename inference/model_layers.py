"""DualAR building blocks with the reference numerics: RMSNorm, interleaved RoPE, GQA, SwiGLU.

Why these are hand-written instead of taken from a library: the published checkpoints were trained
with GPT-J-style *interleaved* RoPE pairs (not HF ``rotate_half``) whose cos/sin table is rounded to
bf16, RMSNorm computed in float32, per-head q/k RMSNorm before RoPE on the slow model only. Getting
any of these subtly different gives plausible but audibly wrong audio, so each is explicit here.
Linear layers can be swapped for FP8 (``ttsfleet.kernels``) once, at load time.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from ttsfleet.switches import ProcessSwitch, one_of

#: SDPA backends for prompt attention, cuDNN's left out: it cost the host 1.3 ms per call at S2 Pro's
#: shape (prefill of 300-400 tokens on an H200, 2026-12-02: 58 % of the prefill call's CPU time, the
#: GPU part 11 us; benchmarks/inference_h200/2026-12-02-ab/run3-prefill-host-coalesce/prefill_host.txt).
#: Flash (no mask) and memory-efficient (mask) attention are cheap to launch; math is the fallback.
PROMPT_ATTENTION = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]

#: How prompt attention serves grouped-query heads: ``expand`` copies each K/V head to its query
#: group (``repeat_interleave``) before SDPA, which every backend accepts; ``native`` hands SDPA the
#: grouped K/V with ``enable_gqa=True`` and skips the copies (10.8 ms of 48.9 ms of the prefill's CPU
#: time on an H200, 2026-12-02 run6), but a backend without GQA support then falls back to another
#: one. Same function either way (tests/inference_model/test_prompt_gqa.py); on an H200 (2026-12-03,
#: benchmarks/inference_h200/prefill_host.py) native cut a prefill call's host time 3-7 % and served
#: c=64 moved 2,393 -> 2,477 frames/s; the S2 Pro FP8 gate passed with it (4/4, 2026-12-03 second
#: session), so native is the default; ``expand`` remains for a backend that lacks GQA. Process
#: switch, read once.
PROMPT_GQA_ENV = "TTSFLEET_PROMPT_GQA"
PROMPT_GQA_MODES = ("expand", "native")


def parse_prompt_gqa(mode: str) -> str:
    """``mode`` if it is one of the GQA modes, else a ``ValueError`` naming the choices (the server
    checks ``TTSFLEET_PROMPT_GQA`` with it at start, before any request can meet a bad value)."""
    if mode not in PROMPT_GQA_MODES:
        raise ValueError(f"{PROMPT_GQA_ENV}={mode!r}: expected one of {', '.join(PROMPT_GQA_MODES)}")
    return mode


#: The switch (:class:`ttsfleet.switches.ProcessSwitch`: read once, registered for the server's start
#: check); ``prompt_gqa`` / ``set_prompt_gqa`` are its bound methods, the names callers use.
PROMPT_GQA_SWITCH: ProcessSwitch[str] = ProcessSwitch(PROMPT_GQA_ENV, "native", parse_prompt_gqa)
#: Prompt attention's GQA mode (``TTSFLEET_PROMPT_GQA``, default ``native``).
prompt_gqa = PROMPT_GQA_SWITCH.get
#: Choose the GQA mode for this process; an unknown mode is a ``ValueError`` naming the choices.
set_prompt_gqa = PROMPT_GQA_SWITCH.set


class RMSNorm(nn.Module):
    """``x / rms(x) * weight`` computed in float32, cast back to the input dtype before the weight."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return y.type_as(x) * self.weight


#: How the two sampling heads (main token, codebooks) compute their float32 logits: ``bf16`` (the
#: default; CUDA, a bf16 model: the checkpoint's own bf16 rows through cuBLAS's bf16 tensor-core GEMM
#: with float32 output, ``torch.mm(out_dtype=float32)``) or ``float32`` (``F.linear`` of float32
#: copies, FP32 SIMT GEMMs; what runs off CUDA or for a float32 model either way). The same products
#: either way (a bf16 x bf16 product is exact in float32, and the float32 copies are exact), float32
#: sums in another order, half the bytes read (the heads are 0.42 GB of a frame's 8.1 GB floor on S2
#: Pro) and tensor cores. Timed on an H200 2026-12-05 (``decode_levers.py``, S2 Pro, 576 positions,
#: ``benchmarks/inference_h200/2026-12-05/run2-levers-gpu-tests``): the whole decode step 0.980 /
#: 0.956 / 0.962 / 0.965 / 0.952x the float32 heads' at batch 1 / 8 / 32 / 64 / 128, and the S2 Pro
#: FP8 greedy gate passes with it; hence the default. Process switch, read once.
HEAD_GEMM_ENV = "TTSFLEET_HEAD_GEMM"
HEAD_GEMMS = ("float32", "bf16")


#: ``float32`` / ``bf16`` (blank: ``bf16``), else a ``ValueError`` naming the choices (the server
#: checks ``TTSFLEET_HEAD_GEMM`` with it at start).
parse_head_gemm = one_of(HEAD_GEMM_ENV, HEAD_GEMMS, "bf16")


HEAD_GEMM_SWITCH: ProcessSwitch[str] = ProcessSwitch(HEAD_GEMM_ENV, "bf16", parse_head_gemm)
#: The heads' GEMM for this process (``TTSFLEET_HEAD_GEMM``, default ``bf16``).
head_gemm = HEAD_GEMM_SWITCH.get
#: Choose the heads' GEMM for this process (tests and benchmarks A/B it).
set_head_gemm = HEAD_GEMM_SWITCH.set


def head_logits(x: Tensor, head: Tensor, head_bf16: Tensor | None) -> Tensor:
    """Float32 logits ``x @ head.T`` (``head``: float32 ``[V, dim]``; ``head_bf16``: its bf16 rows when
    the checkpoint's are bf16, else None): the bf16 GEMM with float32 output where :func:`head_gemm`
    says ``bf16``, ``x`` is bf16 on CUDA and ``head_bf16`` exists; else ``F.linear`` in float32."""
    if head_bf16 is not None and x.is_cuda and x.dtype == torch.bfloat16 and head_gemm() == "bf16":
        rows = x.reshape(-1, x.shape[-1])
        return torch.mm(rows, head_bf16.t(), out_dtype=torch.float32).view(*x.shape[:-1], head_bf16.shape[0])
    return F.linear(x.float(), head)


def rope_table(n_pos: int, head_dim: int, base: float) -> Tensor:
    """``[n_pos, head_dim // 2, 2]`` (cos, sin) in **bf16**, as the reference stores it."""
    inv = 1.0 / (base ** (torch.arange(0, head_dim, 2)[: head_dim // 2].float() / head_dim))
    ang = torch.outer(torch.arange(n_pos, dtype=torch.float32), inv)
    cis = torch.polar(torch.ones_like(ang), ang)
    return torch.stack([cis.real, cis.imag], dim=-1).to(torch.bfloat16)


def apply_rope(x: Tensor, table: Tensor) -> Tensor:
    """Rotate interleaved pairs ``(x[2i], x[2i+1])`` of ``x [B, T, H, D]`` by ``table [B|1, T, D/2, 2]``.

    Computed in float32 (the bf16 table is promoted), returned in ``x.dtype``.
    """
    xs = x.float().reshape(*x.shape[:-1], -1, 2)
    t = table.unsqueeze(2)  # [B, T, 1, D/2, 2]
    c, s = t[..., 0], t[..., 1]
    x0, x1 = xs[..., 0], xs[..., 1]
    out = torch.stack([x0 * c - x1 * s, x1 * c + x0 * s], dim=-1)
    return out.flatten(-2).type_as(x)


class Linear(nn.Module):
    """``nn.Linear`` whose weight can be replaced by an FP8 :class:`QuantizedWeight` at load time."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight = nn.Parameter(torch.empty(out_features, in_features))
        self.bias = nn.Parameter(torch.zeros(out_features)) if bias else None
        self.qweight = None  # ttsfleet.kernels.QuantizedWeight once quantized

    def quantize_(self, scheme: str) -> None:
        from ttsfleet.kernels import quantize_weight

        self.qweight = quantize_weight(self.weight.data, scheme)
        self.weight = None

    def forward(self, x: Tensor) -> Tensor:
        if self.qweight is not None:
            from ttsfleet.kernels import linear_fp8

            return linear_fp8(x, self.qweight, self.bias)
        return F.linear(x, self.weight, self.bias)


class FeedForward(nn.Module):
    """SwiGLU ``w2(silu(w1 x) * w3 x)``; FP8 runs the fused kernel with rows ``[w1; w3]``."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.w1 = Linear(dim, hidden)
        self.w3 = Linear(dim, hidden)
        self.w2 = Linear(hidden, dim)
        self.gate_up_q = None
        self.down_q = None

    def quantize_(self, scheme: str) -> None:
        from ttsfleet.kernels import quantize_weight

        self.gate_up_q = quantize_weight(torch.cat([self.w1.weight.data, self.w3.weight.data], 0), scheme)
        self.down_q = quantize_weight(self.w2.weight.data, scheme)
        self.w1.weight = self.w3.weight = self.w2.weight = None

    def forward(self, x: Tensor) -> Tensor:
        if self.gate_up_q is not None:
            from ttsfleet.kernels import swiglu_mlp_fp8

            return swiglu_mlp_fp8(x, self.gate_up_q, self.down_q)
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Attention(nn.Module):
    """Fused-QKV GQA projections; the KV cache and score computation live in the model."""

    def __init__(self, dim: int, n_head: int, n_kv: int, head_dim: int, qk_norm: bool, eps: float) -> None:
        super().__init__()
        self.n_head, self.n_kv, self.head_dim = n_head, n_kv, head_dim
        self.wqkv = Linear(dim, (n_head + 2 * n_kv) * head_dim)
        self.wo = Linear(n_head * head_dim, dim)
        self.qk_norm = qk_norm
        if qk_norm:
            self.q_norm = RMSNorm(head_dim, eps)
            self.k_norm = RMSNorm(head_dim, eps)

    def qkv(self, x: Tensor, rope: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """``x [B, T, dim]`` -> q ``[B, T, H, D]``, k, v ``[B, T, KV, D]`` (q/k normed and rotated)."""
        b, t, _ = x.shape
        hd = self.head_dim
        q, k, v = self.wqkv(x).split([self.n_head * hd, self.n_kv * hd, self.n_kv * hd], dim=-1)
        q = q.view(b, t, self.n_head, hd)
        k = k.view(b, t, self.n_kv, hd)
        v = v.view(b, t, self.n_kv, hd)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        return apply_rope(q, rope), apply_rope(k, rope), v


def attend(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, causal: bool = False) -> Tensor:
    """GQA attention: q ``[B, T, H, D]``, k/v ``[B, S, KV, D]``, bool mask ``[B, 1, T, S]`` (True = keep).

    Returns ``[B, T, H * D]``. KV head j serves query heads ``j*g .. j*g+g-1`` (reference grouping).

    A masked call always expands the K/V heads: SDPA's memory-efficient kernel, the only fused one
    that takes a mask, does not take ``enable_gqa``, so native GQA with a mask lands on the math
    kernel (scores materialised in float32). That is where the whole-call prefill graphs (always
    masked) and every continuing prompt chunk went (2026-12-06d call 16: the whole graphs' GPU time a
    step 5.5 -> 6.8 ms).
    """
    qh, kh, vh = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    g = qh.shape[1] // kh.shape[1]
    native = g > 1 and mask is None and prompt_gqa() == "native"
    if g > 1 and not native:
        kh = kh.repeat_interleave(g, dim=1)
        vh = vh.repeat_interleave(g, dim=1)
    with sdpa_kernel(PROMPT_ATTENTION):
        y = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, is_causal=causal and mask is None,
                                           enable_gqa=native)
    b, h, t, d = y.shape
    return y.transpose(1, 2).reshape(b, t, h * d)


class Block(nn.Module):
    """Pre-norm block parameters: ``attention``, ``feed_forward``, ``attention_norm``, ``ffn_norm``."""

    def __init__(self, dim: int, n_head: int, n_kv: int, head_dim: int, hidden: int, qk_norm: bool,
                 eps: float) -> None:
        super().__init__()
        self.attention = Attention(dim, n_head, n_kv, head_dim, qk_norm, eps)
        self.feed_forward = FeedForward(dim, hidden)
        self.attention_norm = RMSNorm(dim, eps)
        self.ffn_norm = RMSNorm(dim, eps)

    def quantize_(self, scheme: str) -> None:
        self.attention.wqkv.quantize_(scheme)
        self.attention.wo.quantize_(scheme)
        self.feed_forward.quantize_(scheme)
