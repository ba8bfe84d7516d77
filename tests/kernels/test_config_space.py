"""Every GEMM launch config the tuner can pick, run through Triton's interpreter on CPU.

Why: a config family that nobody ran once gave wrong results at full speed (the SwiGLU epilogue
quantized its output in bn-wide groups, so ``bn=64`` and ``bn=128`` disagreed by 12 % after 36
layers). Here the numerics-relevant part of every config :func:`config_space` offers for the S2 Pro
shapes (tile, split-K, operand swap, TMA or pointer loads) runs at a small shape against float64
math on the same FP8 codes, for both activation forms (FP8 codes, or bf16 quantized in the prologue)
and both schemes. The GPU runs the same space at full size in the sweep, which checks each candidate
before timing it.
"""

from __future__ import annotations

import os
import zlib

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

from ttsfleet.kernels import dispatch  # noqa: E402
from ttsfleet.kernels.check import f64_same_codes  # noqa: E402
from ttsfleet.kernels.layout import cdiv  # noqa: E402
from ttsfleet.kernels.ops import quantize_weight  # noqa: E402
from ttsfleet.kernels.reference import quantize_activation_ref, swiglu_mlp_fp8_ref  # noqa: E402
from ttsfleet.kernels.testing import TOL_SAME_CODES_BF16, randn, rel_err  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
S2_SHAPES = [("swiglu", 19456, 2560), ("down", 2560, 9728), ("linear", 6144, 2560), ("linear", 2560, 4096),
             ("linear", 4096, 2560)]
DECODE_M = (1, 8, 16, 32, 64, 128)


@pytest.fixture(autouse=True)
def _interpreter_or_gpu() -> None:
    if DEV == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("triton was imported before TRITON_INTERPRET could be set")
    if DEV == "cuda" and not dispatch.plan("cuda").fused:
        pytest.skip("the catalog does not run the Triton kernels on this GPU")
    if DEV == "cpu" and not _tg().INTERPRETING:
        pytest.skip("the kernels were imported before TRITON_INTERPRET could be set")


def _tg():  # noqa: ANN202
    from ttsfleet.kernels import triton_gemm

    return triton_gemm


def _space(scheme: str = "bsgemm_fp8") -> list[tuple[str, object]]:
    """(kind, config) for every distinct numerics-relevant config the tuner may pick."""
    tg = _tg()
    seen: dict[tuple, tuple[str, object]] = {}
    for kind, n, k in S2_SHAPES:
        for m in DECODE_M:
            for cfg in tg.config_space(kind, m, n, k, scheme):
                fam = "swiglu" if kind == "swiglu" else "linear"
                key = (fam, cfg.bn, cfg.split_k, cfg.swap, cfg.bm, cfg.tma)
                seen.setdefault(key, (key[0], cfg))
    return [seen[key] for key in sorted(seen)]


SPACE = _space()


def test_the_space_is_small_and_every_config_is_valid() -> None:
    tg = _tg()
    assert 8 <= len(SPACE) <= 40
    for kind, cfg in SPACE:
        tg.check_config(kind, cfg, "bsgemm_fp8")
        tg.check_config(kind, cfg, "mxfp8")
    for kind, n, k in S2_SHAPES:
        for m in DECODE_M:
            assert tg.config_space(kind, m, n, k), (kind, m, n, k)


def test_invalid_configs_are_rejected_before_launch() -> None:
    tg = _tg()
    with pytest.raises(ValueError, match="whole 1x128 groups"):
        tg.check_config("swiglu", tg.GemmConfig(bn=64), "bsgemm_fp8")
    tg.check_config("swiglu", tg.GemmConfig(bn=64), "mxfp8")  # 1x32 groups fit a 64-wide tile
    with pytest.raises(ValueError, match="split_k"):
        tg.check_config("linear", tg.GemmConfig(split_k=5), "bsgemm_fp8")


def _ids(case: tuple[str, object]) -> str:
    kind, c = case
    return f"{kind}-bn{c.bn}-s{c.split_k}-{'swap' if c.swap else f'bm{c.bm}'}-{'tma' if c.tma else 'ptr'}"


# mxfp8 (the RTX 5090 / 6000 PRO scheme) over its whole space too: the sm_120 path runs exactly these
# configs (compiled for sm_120 by compile_check), so each computes the reference once here
CASES = [(case, "bsgemm_fp8") for case in SPACE] + [(case, "mxfp8") for case in _space("mxfp8")]


def test_the_mxfp8_space_is_the_bsgemm_space() -> None:
    """(What lets the tuned H200 table's picks serve mxfp8 on sm_120: the same configs, all valid.)"""
    assert _space("mxfp8") == SPACE


@pytest.mark.parametrize("case,scheme", CASES, ids=lambda v: _ids(v) if isinstance(v, tuple) else v)
def test_every_tunable_config_computes_the_reference(case: tuple[str, object], scheme: str) -> None:
    tg = _tg()
    kind, cfg = case
    gen = torch.Generator().manual_seed(zlib.crc32(f"{_ids(case)}-{scheme}".encode()))
    m = 3 if cfg.swap else 33  # 33: a partial 64-row tile
    if kind == "swiglu":
        _check_swiglu(tg, gen, cfg, scheme, m)
        return
    n, k = 192, 640  # 5 K blocks: splits past K do nothing; n is not a multiple of the 128-wide tile
    qw = quantize_weight(randn(gen, n, k, scale=k ** -0.5, device=DEV), scheme)
    x = randn(gen, m, k, device=DEV, dtype=torch.bfloat16)
    ref = f64_same_codes(x, qw)
    group = tg.act_group(scheme)
    for prequant in (True, False):
        out = torch.full((m, n), float("nan"), device=DEV, dtype=torch.bfloat16)
        if prequant:
            xq, xs = quantize_activation_ref(x, group)
            tg.launch_gemm(xq, xs, qw, out, None, cfg)
        else:
            tg.launch_gemm(x, None, qw, out, None, cfg)
        assert rel_err(out, ref) < TOL_SAME_CODES_BF16, f"prequant={prequant}"


def _check_swiglu(tg, gen: torch.Generator, cfg, scheme: str, m: int) -> None:  # noqa: ANN001
    d, f = 640, 192  # 5 K blocks into h, 1.5 of them (groups of 128) out of it
    gu = quantize_weight(randn(gen, 2 * f, d, scale=d ** -0.5, device=DEV), scheme)
    dn = quantize_weight(randn(gen, d, f, scale=f ** -0.5, device=DEV), scheme)
    x = randn(gen, m, d, device=DEV, dtype=torch.bfloat16)
    group = tg.act_group(scheme)
    hq = torch.empty(m, f, device=DEV, dtype=torch.float8_e4m3fn)
    hs = torch.full((m, cdiv(f, group)), 255 if scheme == "mxfp8" else float("nan"), device=DEV,
                    dtype=torch.uint8 if scheme == "mxfp8" else torch.float32)
    tg.launch_gemm(x, None, gu, hq, None, cfg, epi=1, h_scale=hs)
    out = torch.full((m, d), float("nan"), device=DEV, dtype=torch.bfloat16)
    tg.launch_gemm(hq, hs, dn, out, None, tg.heuristic_config("down", m, d, f))
    # the reference quantizes h in the scheme's own groups: a config-dependent grouping shows here
    assert rel_err(out, swiglu_mlp_fp8_ref(x, gu, dn)) < 2e-2


def test_the_tuned_table_holds_only_configs_the_tuner_offers() -> None:
    """``tuned_h200.json`` (written by the sweep) names configs of :func:`config_space` only."""
    tg = _tg()
    for key, raw in tg._tuned().items():
        kind, n, k, mb = key.split(":")
        cfg = tg.GemmConfig(**raw)
        tg.check_config("swiglu" if kind == "swiglu" else "linear", cfg, "bsgemm_fp8")
        if int(mb):  # (a bucket not swept holds the pick of the nearest swept M)
            assert any(cfg in tg.config_space(kind, m, int(n), int(k)) for m in DECODE_M), key


def test_a_pinned_table_overrides_the_shipped_one_until_dropped() -> None:
    """``pin_table``: a sweep's table timed beside the shipped one in one process (decode_levers'
    ``table@FILE``) — its picks replace the shipped ones for their buckets, None restores them, and a
    config the kernel cannot run is refused before any launch."""
    tg = _tg()
    shipped = tg.get_config("linear", 64, 2560, 4096)
    pick = next(c for c in tg.config_space("linear", 64, 2560, 4096) if c.num_warps == 8 and c != shipped)
    try:
        one_row = tg.get_config("linear", 1, 2560, 4096)
        tg.pin_table({"linear:2560:4096:64": {**tg.config_dict(pick), "us": 9.9}})
        assert tg.get_config("linear", 64, 2560, 4096) == pick
        assert tg.get_config("linear", 33, 2560, 4096) == pick  # the whole 64-row bucket
        assert tg.get_config("linear", 1, 2560, 4096) == one_row  # other buckets keep the shipped pick
        tg.pin_table(None)
        assert tg.get_config("linear", 64, 2560, 4096) == shipped
        with pytest.raises(ValueError, match="split_k 5"):
            tg.pin_table({"linear:2560:4096:64": {**tg.config_dict(pick), "split_k": 5}})
    finally:
        tg.pin_table(None)
