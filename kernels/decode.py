"""The decode step's non-GEMM kernels, one entry point each, dispatched by :mod:`.dispatch`.

What lives here: RMSNorm (+ residual, optionally emitting FP8 codes for the next GEMM), q/k norm +
RoPE + KV-cache store, single-token decode attention over a slot cache (optionally emitting FP8
codes for the output projection), the fused top-k sampler. The Triton kernels are in
``triton_decode`` / ``triton_attention`` (imported lazily: triton is optional); the torch reference
of decode attention is here because the reference decode path calls it on any device.

Why decode attention reads the cache in place: gathering ``cache.k[layer][slots]`` then SDPA copies
``[bs, max_seq_len, kv, d]`` per layer and step and reads every masked position too; at bs 64 x
2048 positions on S2 Pro that is ~40 GB of traffic per frame, ten times the FP8 weights. The kernel
follows the slot index and stops at each slot's length. Static shapes, no host sync: capturable in
a CUDA graph. May import torch, triton and the package's own modules only.

FP8 KV cache: the caches may hold ``float8_e4m3fn`` codes with uint8 exponent tensors ``k_scale`` /
``v_scale`` ``[slots, S, KV]`` beside them: one power-of-two scale per cache position and KV head
(:func:`ttsfleet.kernels.reference.quantize_kv_ref`). Why that granularity: the store kernel holds
the whole head vector of its position in registers, so the amax costs nothing; nothing is carried
between calls (a slot's scales never need a prefill to fix them, a later token never saturates a
scale fixed earlier, and a prompt fed in chunks stores exactly the codes of a one-shot prefill);
power-of-two scales dequantize exactly, so kernel and reference differ only in summation order; and
1 byte per 128-wide head costs 0.8 % beside the halved K/V bytes.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from ttsfleet.switches import ProcessSwitch, all_or_count, off_auto_or_count, one_of

from . import dispatch

#: Largest ``top_k`` the fused sampler handles exactly: it filters only the row's best ``TOPK_CAP``
#: logits. Rows beyond it take the reference sampler.
TOPK_CAP = 64


def _triton_decode() -> Any:
    from . import triton_decode

    return triton_decode


def rmsnorm(x: Tensor, weight: Tensor, eps: float, residual: Tensor | None = None,
            quant_group: int = 0) -> tuple[Any, Tensor]:
    """Fused residual add + RMSNorm (Triton); see :func:`ttsfleet.kernels.triton_decode.rmsnorm`."""
    return _triton_decode().rmsnorm(x, weight, eps, residual, quant_group)


def qkv_rope_store(*args: Any, **kwargs: Any) -> Tensor:
    """Split QKV, q/k RMSNorm, RoPE, K/V into the cache (Triton); see ``triton_decode.qkv_rope_store``."""
    return _triton_decode().qkv_rope_store(*args, **kwargs)


#: How the fused sampler finds a row's best ``TOPK_CAP`` logits: ``kernel`` (one launch that
#: selects in the kernel; the default) or ``torch`` (two launches with ``torch.topk`` between them).
#: Same ids (tested through the interpreter, compiled for sm_90 / sm_120). On an H200 the kernel made
#: the S2 Pro decode step 1.1-2.4 % shorter at batch 1 to 128 (CUDA-graph replay, side by side) and
#: the FP8 gate and the GPU sampler / fused-decode tests passed with it
#: (benchmarks/inference_h200/2026-12-03b/run3, run5). Process switch, read once.
TOPK_SELECT_ENV = "TTSFLEET_TOPK_SELECT"
TOPK_SELECTS = ("torch", "kernel")


#: ``torch`` / ``kernel`` (blank: ``kernel``, the default), else a ``ValueError`` naming the choices
#: (the server checks ``TTSFLEET_TOPK_SELECT`` with it at start).
parse_topk_select = one_of(TOPK_SELECT_ENV, TOPK_SELECTS, "kernel")


#: The switch (:class:`ttsfleet.switches.ProcessSwitch`: read once, registered for the server's start
#: check); the module-level getter and setter below are its bound methods, the names callers use.
TOPK_SELECT_SWITCH: ProcessSwitch[str] = ProcessSwitch(TOPK_SELECT_ENV, "kernel", parse_topk_select)
#: The fused sampler's top-k selection (``TTSFLEET_TOPK_SELECT``, default ``kernel``).
topk_select = TOPK_SELECT_SWITCH.get
#: Choose the selection for this process (tests and benchmarks A/B the two).
set_topk_select = TOPK_SELECT_SWITCH.set


def sample_topk(*args: Any, **kwargs: Any) -> Tensor:
    """The fused top-k sampler (Triton); see ``triton_decode.sample_topk`` (``select`` defaults to
    :func:`topk_select`)."""
    kwargs.setdefault("select", topk_select())
    return _triton_decode().sample_topk(*args, **kwargs)


#: Decode attention with each (row, KV head)'s keys shared out among several programs and merged
#: (:mod:`.triton_attention_split`): ``auto`` (:func:`auto_splits`, the default since 2026-12-04:
#: an H200's batch-1 step at 4,096 positions 6.74 -> 5.00 ms, batch 8 7.24 -> 6.40, at 576 positions
#: 4.88 -> 4.76 ms; ``benchmarks/inference_h200/2026-12-04/run12-served-steady-levers``), ``off`` (one program
#: per (row, KV head)) or a fixed count 1 .. :data:`MAX_SPLITS`. Process switch, read once.
ATTN_SPLITS_ENV = "TTSFLEET_ATTN_SPLITS"
#: Most shares per (row, KV head): beyond it the merge's reads outgrow what the extra programs save.
MAX_SPLITS = 16
#: SMs assumed where the device reports none (Triton's interpreter on the CPU): an H200's.
NOMINAL_SMS = 132


def sm_count(dev: torch.device) -> int:
    """The device's SMs (:data:`NOMINAL_SMS` off CUDA): what split-KV attention and the persistent
    one-launch kernels size their grids by."""
    return torch.cuda.get_device_properties(dev).multi_processor_count if dev.type == "cuda" else NOMINAL_SMS


#: ``off`` / ``auto`` / a count (blank: ``auto``), else a ``ValueError`` naming the choices (the
#: server checks ``TTSFLEET_ATTN_SPLITS`` with it at start).
parse_attn_splits = off_auto_or_count(ATTN_SPLITS_ENV, MAX_SPLITS, "auto")


ATTN_SPLITS_SWITCH: ProcessSwitch[str | int] = ProcessSwitch(ATTN_SPLITS_ENV, "auto", parse_attn_splits)
#: This process's attention split (``TTSFLEET_ATTN_SPLITS``, default ``auto``).
attn_splits = ATTN_SPLITS_SWITCH.get
#: Choose the attention split for this process (tests and benchmarks A/B it).
set_attn_splits = ATTN_SPLITS_SWITCH.set


#: Decode attention's launch tile, ``WARPSxKEYS``: warps per program and keys per block, both kernels
#: (one pass and split). ``4x64`` (the default) compiles to 255 registers and spills 16-24 B per
#: thread on sm_90; ``8x32`` to 128-136 registers and none (``compile_check``'s resource report,
#: 2026-12-04): more warps resident to hide HBM latency. Timed on an H200 (``decode_levers.py``'s
#: ``tile@8x32``, ``benchmarks/inference_h200/2026-12-04/run12-served-steady-levers``): slower almost
#: everywhere, so ``4x64`` stays the default. Process switch, read once.
ATTN_TILE_ENV = "TTSFLEET_ATTN_TILE"
ATTN_TILES = ("4x64", "4x32", "8x64", "8x32")


def parse_attn_tile(value: str) -> tuple[int, int]:
    """``(warps, keys per block)`` of a tile name (blank: ``4x64``), else a ``ValueError`` naming
    the choices (the server checks ``TTSFLEET_ATTN_TILE`` with it at start)."""
    warps, keys = one_of(ATTN_TILE_ENV, ATTN_TILES, "4x64")(value).split("x")
    return int(warps), int(keys)


ATTN_TILE_SWITCH: ProcessSwitch[tuple[int, int]] = ProcessSwitch(ATTN_TILE_ENV, "4x64", parse_attn_tile)
#: This process's attention tile ``(warps, keys per block)`` (``TTSFLEET_ATTN_TILE``, default ``4x64``).
attn_tile = ATTN_TILE_SWITCH.get
#: Choose the attention tile for this process (tests and benchmarks A/B it).
set_attn_tile = ATTN_TILE_SWITCH.set


#: Programmatic dependent launch of the Triton decode kernels (``TTSFLEET_PDL``): ``on`` (the default
#: on the GPU: each kernel may launch while its predecessor drains, and waits before touching
#: memory) or ``off`` (plain stream order). Why a switch: to tell a race between launches from a
#: fault in a kernel's arithmetic without a rebuild (a c=128 run's whole batch went non-finite in
#: one step on an H100, 2026-12-06f). Read once, when ``triton_gemm`` is first imported.
PDL_ENV = "TTSFLEET_PDL"
PDL_SWITCH: ProcessSwitch[bool] = ProcessSwitch(
    PDL_ENV, "on", lambda raw: one_of(PDL_ENV, ("on", "off"), "on")(raw) == "on")


#: The decode kernels' prefetch into L2 before they wait for their predecessor (programmatic
#: dependent launch), two switches of one form: ``off``, ``auto`` (as much of the
#: program's share as fits the launch's bytes in half of L2, :func:`prefetch_blocks`) or a count of
#: blocks per program 1 .. :data:`MAX_PREFETCH_BLOCKS`. Why: with PDL a kernel's programs start while
#: the kernel ahead of it still runs, but until now they waited before touching memory; what no
#: predecessor writes can be read then. ``TTSFLEET_GEMM_PREFETCH``: each FP8 GEMM's weight rows
#: (K blocks of 128), which nothing writes; the small GEMMs (qkv, o) sit at 34-48 % of copy
#: bandwidth on an H200 with a fixed few us per launch (issue #26). ``TTSFLEET_ATTN_PREFETCH``:
#: decode attention's K/V rows (key blocks): the keys before the newest were written steps ago, and
#: a prefetch is only a hint (a stale slot or length read before the wait costs bandwidth, never a
#: result). Defaults: the GEMMs prefetch 2 blocks per program, the attention nothing. The whole decode
#: step from a CUDA graph, side by side (``decode_levers.py``, 2 rounds, x prefetch off): on an H200
#: (2026-12-05 run2-levers) 0.989 / 0.983 / 0.998 / 0.984 / 1.001 at batch 1 / 8 / 32 / 64 / 128; on
#: an H100 on today's defaults (benchmarks/inference_h200/2026-12-05c/call3-levers) 0.965 / 0.957 /
#: 0.976 / 0.991 / 1.001; ``auto`` and 4 blocks were no better. Process switches, read once.
GEMM_PREFETCH_ENV = "TTSFLEET_GEMM_PREFETCH"
ATTN_PREFETCH_ENV = "TTSFLEET_ATTN_PREFETCH"
#: Most blocks one program prefetches: 64 K blocks = a whole 8,192-wide row share of a GEMM.
MAX_PREFETCH_BLOCKS = 64


parse_gemm_prefetch = off_auto_or_count(GEMM_PREFETCH_ENV, MAX_PREFETCH_BLOCKS, "2")
parse_attn_prefetch = off_auto_or_count(ATTN_PREFETCH_ENV, MAX_PREFETCH_BLOCKS, "off")
GEMM_PREFETCH_SWITCH: ProcessSwitch[str | int] = ProcessSwitch(GEMM_PREFETCH_ENV, "2", parse_gemm_prefetch)
ATTN_PREFETCH_SWITCH: ProcessSwitch[str | int] = ProcessSwitch(ATTN_PREFETCH_ENV, "off", parse_attn_prefetch)
#: This process's GEMM weight prefetch (``TTSFLEET_GEMM_PREFETCH``, default 2 blocks per program).
gemm_prefetch = GEMM_PREFETCH_SWITCH.get
#: Choose the GEMM weight prefetch for this process (tests and benchmarks A/B it).
set_gemm_prefetch = GEMM_PREFETCH_SWITCH.set
#: This process's decode-attention K/V prefetch (``TTSFLEET_ATTN_PREFETCH``, default ``off``).
attn_prefetch = ATTN_PREFETCH_SWITCH.get
#: Choose the decode-attention K/V prefetch for this process.
set_attn_prefetch = ATTN_PREFETCH_SWITCH.set


def prefetch_blocks(mode: str | int, per: int, programs: int, block_bytes: int, l2_bytes: int) -> int:
    """Blocks each of ``programs`` programs prefetches (0: none), for ``per`` blocks per program of
    ``block_bytes`` bytes each (all its rows: gate and up together; keys and values together).
    ``auto``: as many as fit the launch's bytes in half of ``l2_bytes`` (the other half keeps the
    activations, partials and what the running kernel reads), so an L2 smaller than one block step
    prefetches nothing."""
    if mode == "off":
        return 0
    if mode == "auto":
        step = max(1, programs * block_bytes)
        return min(per, (l2_bytes // 2) // step)
    return min(per, int(mode))


@cache
def l2_bytes(index: int) -> int:
    """The device's L2 size (bytes), as its properties report it."""
    return int(torch.cuda.get_device_properties(index).L2_cache_size)


#: The RoPE + KV store done inside decode attention (``fused``: each attention program rotates its own
#: query heads and stores its own KV head, one launch per layer fewer: 76 per S2 Pro frame, whose
#: RoPE + store launches took 137 / 265 us of a 5.0 / 9.1 ms step at batch 1 / 64 on an H200,
#: ``benchmarks/inference_h200/2026-12-01-step``) or ``separate`` (the default: the RoPE + store
#: kernel, then attention). Same values either way (the same jit helpers; tested bit for bit in
#: Triton's interpreter). Timed on an H200 (``decode_levers.py``'s ``ropefused`` row,
#: ``benchmarks/inference_h200/2026-12-05/run2-levers-gpu-tests``): 1.3-1.8 % slower at batch 1-64
#: (equal at 128), so ``separate`` stays the default. Process switch, read once.
ROPE_ATTENTION_ENV = "TTSFLEET_ROPE_ATTENTION"
ROPE_ATTENTIONS = ("separate", "fused")


#: ``separate`` / ``fused`` (blank: ``separate``), else a ``ValueError`` naming the choices (the
#: server checks ``TTSFLEET_ROPE_ATTENTION`` with it at start).
parse_rope_attention = one_of(ROPE_ATTENTION_ENV, ROPE_ATTENTIONS, "separate")


ROPE_ATTENTION_SWITCH: ProcessSwitch[str] = ProcessSwitch(ROPE_ATTENTION_ENV, "separate",
                                                          parse_rope_attention)
#: This process's RoPE placement (``TTSFLEET_ROPE_ATTENTION``, default ``separate``).
rope_attention_mode = ROPE_ATTENTION_SWITCH.get
#: Choose the RoPE placement for this process (tests and benchmarks A/B it).
set_rope_attention = ROPE_ATTENTION_SWITCH.set


#: Where the FP8 activation scales a cuBLAS block-scaled GEMM reads come from: ``copy`` (the default:
#: the fused RMSNorm and decode attention write them row-major ``[M, K/128]`` and
#: :func:`ttsfleet.kernels.cublas_fp8.gemm_codes` copies them into the outer-dim-major order cuBLAS
#: wants, strides ``(1, M)``) or ``direct`` (they write them in that order where the GEMM that reads
#: them goes to cuBLAS: rows >= the catalog's ``prefill_gemm_min_rows``). Why: at decode batches of
#: 65+ rows on an H100 (2026-12-08, ``benchmarks/inference_h200/2026-12-08/call38-h100-step``, batch
#: 96) those copies were 228 ``elementwise_kernel`` launches, 333 us of an 11.5 ms step (3 per layer
#: pass: qkv and gate_up after the RMSNorm, o after attention). The same values either way; the speed
#: is not measured yet (``decode_levers.py``'s ``scalesdirect`` variant). Process switch, read once.
CUBLAS_SCALES_ENV = "TTSFLEET_CUBLAS_SCALES"
CUBLAS_SCALES = ("copy", "direct")

#: ``copy`` / ``direct`` (blank: ``copy``), else a ``ValueError`` naming the choices.
parse_cublas_scales = one_of(CUBLAS_SCALES_ENV, CUBLAS_SCALES, "copy")

CUBLAS_SCALES_SWITCH: ProcessSwitch[str] = ProcessSwitch(CUBLAS_SCALES_ENV, "copy", parse_cublas_scales)
#: This process's scale placement for cuBLAS's GEMMs (``TTSFLEET_CUBLAS_SCALES``, default ``copy``).
cublas_scales = CUBLAS_SCALES_SWITCH.get
#: Choose it for this process (tests and benchmarks A/B it).
set_cublas_scales = CUBLAS_SCALES_SWITCH.set


def scales_outer_major(plan: dispatch.KernelPlan, rows: int) -> bool:
    """Whether a device of ``plan`` writes FP8 activation scales of ``rows`` rows outer-dim-major:
    ``TTSFLEET_CUBLAS_SCALES=direct`` and the GEMM reading them goes to cuBLAS (``plan.large_gemm``)."""
    return cublas_scales() == "direct" and plan.large_gemm(rows)


#: The FP8 SwiGLU MLP's launches at decode M (<= 64 rows): ``two`` (the default: the gate_up GEMM
#: with the SwiGLU epilogue, then the down GEMM) or ``one`` (both GEMMs' tiles as work items of one
#: persistent launch whose down items prefetch their weights into L2 while gate_up runs,
#: :func:`ttsfleet.kernels.triton_mlp.swiglu_mlp_one_launch`). Why: at M=1 on an H200 the two launches
#: take 33.6 us against a 17.6 us weight floor (issue #26's target: <= 24 us); 76 MLPs per S2 Pro
#: frame. The same values as two launches with the same tiles (bit for bit in Triton's interpreter).
#: Timed on an H200 (``one_launch.py``, ``benchmarks/inference_h200/2026-12-05/run1-one-launch``):
#: 1.44-1.53x the two launches' time at M = 1-64, so ``two`` stays the default. Process switch, read
#: once.
MLP_LAUNCH_ENV = "TTSFLEET_MLP_LAUNCH"
MLP_LAUNCHES = ("two", "one")


#: ``two`` / ``one`` (blank: ``two``), else a ``ValueError`` naming the choices (the server checks
#: ``TTSFLEET_MLP_LAUNCH`` with it at start).
parse_mlp_launch = one_of(MLP_LAUNCH_ENV, MLP_LAUNCHES, "two")


MLP_LAUNCH_SWITCH: ProcessSwitch[str] = ProcessSwitch(MLP_LAUNCH_ENV, "two", parse_mlp_launch)
#: This process's MLP launches (``TTSFLEET_MLP_LAUNCH``, default ``two``).
mlp_launch = MLP_LAUNCH_SWITCH.get
#: Choose the MLP launches for this process (tests and benchmarks A/B them).
set_mlp_launch = MLP_LAUNCH_SWITCH.set


#: The fast model's attention half at decode (QKV GEMM -> RoPE + KV store + attention over the frame
#: cache -> O GEMM): ``separate`` (the default: its three or four launches) or ``one`` (one persistent
#: launch of work items, :func:`frame_attention_block`). Why: 15.7 + 10.5 MB of weights and a few KB
#: of attention per layer pass, 40 passes per S2 Pro frame, where the QKV and O GEMMs alone took 7.8
#: and 6.5 us at M=1 for 3.7 and 2.5 us of bytes (issue #26). The same values as the separate launches
#: with the same tiles (bit for bit in Triton's interpreter). Timed on an H200 (``one_launch.py``,
#: ``benchmarks/inference_h200/2026-12-05/run1-one-launch``): 1.38-1.52x the separate launches' time
#: at M = 1-64, so ``separate`` stays the default. Process switch, read once.
FAST_ATTN_LAUNCH_ENV = "TTSFLEET_FAST_ATTN_LAUNCH"
FAST_ATTN_LAUNCHES = ("separate", "one")


#: ``separate`` / ``one`` (blank: ``separate``), else a ``ValueError`` naming the choices (the server
#: checks ``TTSFLEET_FAST_ATTN_LAUNCH`` with it at start).
parse_fast_attn_launch = one_of(FAST_ATTN_LAUNCH_ENV, FAST_ATTN_LAUNCHES, "separate")


FAST_ATTN_LAUNCH_SWITCH: ProcessSwitch[str] = ProcessSwitch(FAST_ATTN_LAUNCH_ENV, "separate",
                                                            parse_fast_attn_launch)
#: This process's fast attention launches (``TTSFLEET_FAST_ATTN_LAUNCH``, default ``separate``).
fast_attn_launch = FAST_ATTN_LAUNCH_SWITCH.get
#: Choose the fast attention launches for this process (tests and benchmarks A/B them).
set_fast_attn_launch = FAST_ATTN_LAUNCH_SWITCH.set


#: The kernel of a decode-sized linear over FP8 weights in the fused path (at most
#: :data:`DECODE_GEMM_MAX_ROWS` rows): ``fp8`` (the default: the block-scaled FP8 product, activations
#: as FP8 codes from the fused norms and attention) or ``a16`` (the W8A16 prototype of issue #26,
#: :func:`ttsfleet.kernels.ops.linear_w8a16`: the same FP8 weight bytes widened in the tile, the
#: activations in bf16, no per-block rescale; the norms and attention then hand the GEMMs bf16, and
#: the MLP is two launches as in the FP8 path: gate_up with the SwiGLU epilogue into bf16, then down).
#: Its numerics are W8A16's (closer to bf16), not the FP8 contract's. Measured and rejected (H100,
#: 2026-12-07c): slower than the FP8 kernel at every S2 Pro shape and M, the step 1.20-1.45x longer at
#: batch 1-128; kept, off, as the record. ``deepgemm``: the same FP8 codes through DeepGEMM
#: (:mod:`.deepgemm_fp8`, where ``deep_gemm`` imports; not yet timed). Process switch, read once.
DECODE_GEMM_ENV = "TTSFLEET_DECODE_GEMM"
DECODE_GEMMS = ("fp8", "a16", "deepgemm")
#: Rows up to which ``a16`` / ``deepgemm`` take a linear; larger ones (prefill pieces) keep the FP8 path.
DECODE_GEMM_MAX_ROWS = 128
_decode_gemm_choice = one_of(DECODE_GEMM_ENV, DECODE_GEMMS, "fp8")


def parse_decode_gemm(value: str) -> str:
    """The choice, checked against what this process can run: ``deepgemm`` where ``deep_gemm`` does
    not import is the same one-line ``ValueError`` as a misspelt choice (at serve start, not at the
    first decode step)."""
    choice = _decode_gemm_choice(value)
    if choice == "deepgemm":
        from .deepgemm_fp8 import unavailable

        why = unavailable()
        if why:
            raise ValueError(f"{DECODE_GEMM_ENV}=deepgemm: DeepGEMM cannot run here ({why})")
    return choice


DECODE_GEMM_SWITCH: ProcessSwitch[str] = ProcessSwitch(DECODE_GEMM_ENV, "fp8", parse_decode_gemm)
#: This process's decode GEMM (``TTSFLEET_DECODE_GEMM``, default ``fp8``).
decode_gemm = DECODE_GEMM_SWITCH.get
#: Choose the decode GEMM for this process (tests and benchmarks A/B it).
set_decode_gemm = DECODE_GEMM_SWITCH.set

#: The rows ``LO-HI`` of the codes GEMMs that ``TTSFLEET_DECODE_GEMM=deepgemm`` sends to DeepGEMM (default
#: every decode size, ``1-128``); the others keep their usual kernel (ours below, cuBLAS at the
#: catalog's prefill rows). Why: a kernel may win the large decode batches and lose the small ones
#: (ours at M = 1 sits near 80 % of the copy bandwidth on gate_up); the decode step is timed per batch
#: (``decode_levers.py``), and a window lets the server take each kernel where it measured faster.
DEEPGEMM_ROWS_ENV = "TTSFLEET_DEEPGEMM_ROWS"


def parse_deepgemm_rows(value: str) -> tuple[int, int]:
    """``"16-128"`` -> ``(16, 128)``; a ``ValueError`` in one line unless ``1 <= LO <= HI <= 128``."""
    lo, sep, hi = value.strip().partition("-")
    if sep and lo.strip().isdigit() and hi.strip().isdigit() \
            and 1 <= int(lo) <= int(hi) <= DECODE_GEMM_MAX_ROWS:
        return int(lo), int(hi)
    raise ValueError(f"{DEEPGEMM_ROWS_ENV}={value.strip()!r}: expected LO-HI rows, "
                     f"1 <= LO <= HI <= {DECODE_GEMM_MAX_ROWS} (e.g. 16-{DECODE_GEMM_MAX_ROWS})")


DEEPGEMM_ROWS_SWITCH: ProcessSwitch[tuple[int, int]] = ProcessSwitch(
    DEEPGEMM_ROWS_ENV, f"1-{DECODE_GEMM_MAX_ROWS}", parse_deepgemm_rows)
#: The rows DeepGEMM takes when chosen (``TTSFLEET_DEEPGEMM_ROWS``, default ``1-128``).
deepgemm_rows = DEEPGEMM_ROWS_SWITCH.get
#: Choose them for this process (tests and benchmarks A/B them).
set_deepgemm_rows = DEEPGEMM_ROWS_SWITCH.set

#: The weight shapes ``NxK`` (comma-separated; ``all``, the default: every block-scaled one) whose codes
#: GEMMs ``TTSFLEET_DECODE_GEMM=deepgemm`` sends to DeepGEMM; the other shapes keep their usual kernel.
#: Why: one kernel may win some of a layer's GEMMs and lose others at the same rows (ours streams
#: gate_up's 50 MB at ~80 % of the copy bandwidth at M = 1 while qkv and o sit at 30-57 %); the GEMM
#: table (``benchmarks/inference_h200/deepgemm_gemm.py``, its ``best_fp8`` estimate) names the winners
#: per shape, and this takes them. A two-weight MLP (gate_up, down) goes to DeepGEMM only when both
#: of its shapes are listed.
DEEPGEMM_SHAPES_ENV = "TTSFLEET_DEEPGEMM_SHAPES"


def parse_deepgemm_shapes(value: str) -> frozenset[tuple[int, int]] | None:
    """``"all"`` -> None (every shape); ``"6144x2560,2560x4096"`` -> those ``(N, K)``; else a one-line
    ``ValueError``."""
    text = value.strip().lower()
    if text in ("", "all"):
        return None
    shapes = set()
    for item in text.split(","):
        n, sep, k = item.strip().partition("x")
        if not (sep and n.isdigit() and k.isdigit() and int(n) > 0 and int(k) > 0):
            raise ValueError(f"{DEEPGEMM_SHAPES_ENV}={value.strip()!r}: expected all or weight shapes NxK, "
                             "comma-separated (e.g. 6144x2560,2560x4096)")
        shapes.add((int(n), int(k)))
    return frozenset(shapes)


DEEPGEMM_SHAPES_SWITCH: ProcessSwitch[frozenset[tuple[int, int]] | None] = ProcessSwitch(
    DEEPGEMM_SHAPES_ENV, "all", parse_deepgemm_shapes)
#: The weight shapes DeepGEMM takes when chosen (``TTSFLEET_DEEPGEMM_SHAPES``; None: all).
deepgemm_shapes = DEEPGEMM_SHAPES_SWITCH.get
#: Choose them for this process (tests and benchmarks A/B them).
set_deepgemm_shapes = DEEPGEMM_SHAPES_SWITCH.set

#: The SMs DeepGEMM's persistent GEMMs size their grids by (``TTSFLEET_DEEPGEMM_SMS``: ``all``, the default,
#: or a count; handed to ``deep_gemm.set_num_sms``). Why: DeepGEMM launches one program per SM and has each
#: walk its share of the tiles, so a program whose SM is busy with another process's kernels holds the
#: whole GEMM back; in the served path the codec process runs its kernels beside the step's under MPS.
#: On an H100 DeepGEMM's step was 13-15 % shorter than ours at batch 40-64 alone, yet served c=64 ran
#: 1.7 % slower with it (2026-12-07e): fewer programs than SMs leave room for the codec's kernels.
#: Unmeasured: ``next_calls.sh 39`` serves it beside all SMs.
DEEPGEMM_SMS_ENV = "TTSFLEET_DEEPGEMM_SMS"
DEEPGEMM_SMS_SWITCH: ProcessSwitch[str | int] = ProcessSwitch(
    DEEPGEMM_SMS_ENV, "all", all_or_count(DEEPGEMM_SMS_ENV, 1024, "all"))
#: The SM count DeepGEMM is handed (``"all"``: the device's).
deepgemm_sms = DEEPGEMM_SMS_SWITCH.get
#: Choose it for this process (tests and benchmarks A/B it).
set_deepgemm_sms = DEEPGEMM_SMS_SWITCH.set


def frame_attention_block(*args: Any, **kwargs: Any) -> Tensor:
    """The fast model's attention half in one launch (Triton); see
    ``triton_attention_block.attention_block_one_launch``."""
    from .triton_attention_block import attention_block_one_launch

    return attention_block_one_launch(*args, **kwargs)


def attention_block_n(cache_len: int) -> int:
    """Keys per block of both attention kernels: the tile's, or 16 for a frame-local cache of <= 16
    positions."""
    return attn_tile()[1] if cache_len > 16 else 16


def auto_splits(rows: int, kv_heads: int, cache_len: int, sms: int) -> int:
    """Shares that fill about two waves of ``sms`` SMs with ``rows x kv_heads x shares`` programs,
    each share at least 4 key blocks of the cache's length, at most :data:`MAX_SPLITS`; 1 where the
    rows alone fill one wave. Why one wave: on an H200 at 4,096 positions batch 32 (256 programs)
    split in 2 ran 1.059x slower, batch 64 (512) unsplit is the default's step, batch 8 (64
    programs, 5 shares) 0.884x and batch 1 (16 shares) 0.742x (run12, 2026-12-04)."""
    programs = max(1, rows * kv_heads)
    if programs >= sms:
        return 1
    want = -(-2 * sms // programs)
    longest = max(1, cache_len // (4 * attention_block_n(cache_len)))
    return max(1, min(want, longest, MAX_SPLITS))


def attention_splits(q: Tensor, k_cache: Tensor) -> int:
    """Shares per (row, KV head) for this call: from shapes and the process switch only, never from
    the lengths, so a captured CUDA graph keeps it."""
    mode = attn_splits()
    if mode == "off":
        return 1
    cache_len = k_cache.shape[1]
    if mode == "auto":
        return auto_splits(q.shape[0], k_cache.shape[2], cache_len, sm_count(q.device))
    return max(1, min(int(mode), -(-cache_len // attention_block_n(cache_len))))


def check_kv_cache(k_cache: Tensor, v_cache: Tensor, k_scale: Tensor | None, v_scale: Tensor | None) -> bool:
    """True for an FP8 cache (codes + exponents), False for a dense one; ValueError for a mix."""
    fp8 = k_cache.dtype == torch.float8_e4m3fn
    if (v_cache.dtype == torch.float8_e4m3fn) != fp8 or (k_scale is None) != (v_scale is None):
        raise ValueError("K and V caches must both be FP8 (with both scales) or both dense")
    if fp8 != (k_scale is not None):
        raise ValueError("an FP8 KV cache needs its k_scale / v_scale exponents, a dense one none")
    if fp8 and (tuple(k_scale.shape) != tuple(k_cache.shape[:-1]) or k_scale.dtype != torch.uint8
                or k_scale.stride() != v_scale.stride()):
        raise ValueError(f"KV exponents must be uint8 {list(k_cache.shape[:-1])} with equal strides, got "
                         f"{k_scale.dtype} {list(k_scale.shape)}")
    return fp8


def decode_attention_ref(q: Tensor, k_cache: Tensor, v_cache: Tensor, slots: Tensor,
                         lengths: Tensor, k_scale: Tensor | None = None,
                         v_scale: Tensor | None = None) -> Tensor:
    """q ``[bs, H, D]``; caches ``[max_slots, S, KV, D]``; attend keys ``< lengths[b]`` of ``slots[b]``.

    Returns ``[bs, H, D]``. KV head j serves query heads ``j*g .. j*g+g-1``. An FP8 cache is
    dequantized (exactly) to q's dtype first.
    """
    k, v = k_cache[slots], v_cache[slots]
    if check_kv_cache(k_cache, v_cache, k_scale, v_scale):
        from .reference import dequantize_kv

        k, v = dequantize_kv(k, k_scale[slots], q.dtype), dequantize_kv(v, v_scale[slots], q.dtype)
    k, v = k.transpose(1, 2), v.transpose(1, 2)  # [bs, KV, S, D]
    g = q.shape[1] // k.shape[1]
    if g > 1:
        k = k.repeat_interleave(g, dim=1)
        v = v.repeat_interleave(g, dim=1)
    s = k.shape[2]
    mask = (torch.arange(s, device=q.device)[None, :] < lengths[:, None])[:, None, None, :]
    return F.scaled_dot_product_attention(q[:, :, None], k, v, attn_mask=mask)[:, :, 0]


def attention_kernel_fits(q: Tensor, k_cache: Tensor, v_cache: Tensor) -> bool:
    """Shapes and dtypes the Triton kernel computes with the reference's numerics."""
    half = (torch.bfloat16, torch.float16)
    if q.dtype not in (half if q.is_cuda else (*half, torch.float32)):
        return False  # (float32 on CUDA would run tf32 dots: not the reference's numerics)
    d = q.shape[-1]
    return d >= 16 and not d & (d - 1) and k_cache.is_contiguous() and v_cache.is_contiguous()


def _triton_attention(query: Any, rows: Tensor, k_cache: Tensor, v_cache: Tensor, slots: Tensor | None,
                      lengths: Tensor, quant_group: int, k_scale: Tensor | None,
                      v_scale: Tensor | None) -> Any:
    """The Triton decode attention for ``query`` (q, or a ``FusedRope``): split-KV where
    :func:`attention_splits` gives more than one share for ``rows`` (the tensor whose row count and
    device it reads), else the one-pass kernel."""
    splits = attention_splits(rows, k_cache)
    if splits > 1:
        from .triton_attention_split import decode_attention_split

        return decode_attention_split(query, k_cache, v_cache, slots, lengths, splits, quant_group, k_scale,
                                      v_scale)
    from .triton_attention import decode_attention_triton

    return decode_attention_triton(query, k_cache, v_cache, slots, lengths, quant_group, k_scale, v_scale)


def rope_attention(qkv: Tensor, n_head: int, head_dim: int, rope: Tensor, pos: Tensor, k_cache: Tensor,
                   v_cache: Tensor, slots: Tensor | None, lengths: Tensor, q_norm: Tensor | None = None,
                   k_norm: Tensor | None = None, eps: float = 1e-6, quant_group: int = 0,
                   k_scale: Tensor | None = None, v_scale: Tensor | None = None) -> Any:
    """:func:`qkv_rope_store` then :func:`decode_attention` (their arguments, ``n_kv`` the cache's):
    in one launch where :func:`rope_attention_mode` is ``fused`` and the Triton kernel fits (two with
    split-KV: partials then merge), else the two calls. Returns what :func:`decode_attention` does."""
    kv = k_cache.shape[2]
    shaped = qkv.new_empty(0, n_head, head_dim)  # what the fit check reads: dtype, device, head size
    if (rope_attention_mode() == "fused" and dispatch.use_triton(qkv) and qkv.stride(1) == 1
            and attention_kernel_fits(shaped, k_cache, v_cache)):
        from .triton_attention import FusedRope

        check_kv_cache(k_cache, v_cache, k_scale, v_scale)
        fused = FusedRope(qkv, n_head, head_dim, rope, pos, q_norm, k_norm, eps)
        return _triton_attention(fused, qkv, k_cache, v_cache, slots, lengths, quant_group, k_scale, v_scale)
    q = qkv_rope_store(qkv, n_head, kv, head_dim, rope, pos, k_cache, v_cache, slots, q_norm, k_norm, eps=eps,
                       k_scale=k_scale, v_scale=v_scale)
    return decode_attention(q, k_cache, v_cache, slots, lengths, quant_group, k_scale, v_scale)


def decode_attention(q: Tensor, k_cache: Tensor, v_cache: Tensor, slots: Tensor | None, lengths: Tensor,
                     quant_group: int = 0, k_scale: Tensor | None = None,
                     v_scale: Tensor | None = None) -> Any:
    """Triton where the device's plan says so and the shape fits, else :func:`decode_attention_ref`.

    ``slots`` None: row b reads cache slot b (the fast model's frame-local cache). ``lengths`` may hold
    one value for every row (shape ``[1]``). ``quant_group`` > 0 (Triton only, ``D % group == 0``):
    returns ``(fp8 codes [bs, H * D], scales)`` of the output instead of the bf16 ``[bs, H, D]``.
    ``k_scale`` / ``v_scale``: the exponents of an FP8 cache (see the module docstring).
    """
    check_kv_cache(k_cache, v_cache, k_scale, v_scale)
    if dispatch.use_triton(q) and attention_kernel_fits(q, k_cache, v_cache):
        return _triton_attention(q, q, k_cache, v_cache, slots, lengths, quant_group, k_scale, v_scale)
    if quant_group:
        raise ValueError("a quantized attention output needs the Triton kernel")
    bs = q.shape[0]
    rows = torch.arange(bs, device=q.device) if slots is None else slots
    return decode_attention_ref(q, k_cache, v_cache, rows, lengths.expand(bs), k_scale, v_scale)
