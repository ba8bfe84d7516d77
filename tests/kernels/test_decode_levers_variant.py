"""``benchmarks/inference_h200/decode_levers.py``'s variant names switch the process as they say. Why: the
decode step is timed per variant on the device, where a name that silently left a switch at its default
would time the default twice and call it a lever (here: DeepGEMM's rows window, ``deepgemm@LO-HI``)."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest

from tests.scripts import load_script

pytest.importorskip("torch")


@pytest.fixture
def levers(monkeypatch):  # noqa: ANN001, ANN201
    """The script, with a stand-in ``deep_gemm`` (the real one is built on the GPU machine only) so the
    switch accepts ``deepgemm``; every switch it touches is reset afterwards."""
    from ttsfleet.kernels import decode, deepgemm_fp8, dispatch

    stand_in = types.ModuleType("deep_gemm")
    stand_in.fp8_gemm_nt = lambda *a, **k: None
    monkeypatch.setitem(sys.modules, "deep_gemm", stand_in)
    deepgemm_fp8._module.cache_clear()
    yield load_script("benchmarks/inference_h200/decode_levers.py")
    deepgemm_fp8._module.cache_clear()
    dispatch.use_catalog(None)
    for switch in (decode.DECODE_GEMM_SWITCH, decode.DEEPGEMM_ROWS_SWITCH, decode.DEEPGEMM_SHAPES_SWITCH,
                   decode.ATTN_SPLITS_SWITCH,
                   decode.ATTN_TILE_SWITCH, decode.ROPE_ATTENTION_SWITCH, decode.GEMM_PREFETCH_SWITCH,
                   decode.ATTN_PREFETCH_SWITCH, decode.TOPK_SELECT_SWITCH, decode.MLP_LAUNCH_SWITCH,
                   decode.FAST_ATTN_LAUNCH_SWITCH, decode.CUBLAS_SCALES_SWITCH):
        switch.reset()


def test_deepgemm_variants_set_the_backend_and_its_rows_and_the_default_sets_them_back(levers):
    from ttsfleet.kernels import decode

    levers._variant("deepgemm@16-128")
    assert (decode.decode_gemm(), decode.deepgemm_rows()) == ("deepgemm", (16, 128))
    levers._variant("deepgemm")
    assert decode.deepgemm_rows() == (1, 128), "a plain deepgemm takes every decode size"
    levers._variant("default")
    assert decode.decode_gemm() == "fp8"
    with pytest.raises(ValueError, match="TTSFLEET_DEEPGEMM_ROWS='0-8'"):
        levers._variant("deepgemm@0-8")


def test_a_deepgemm_variant_with_shapes_sets_them_and_a_plain_one_takes_all_again(levers):
    from ttsfleet.kernels import decode

    levers._variant("deepgemm@16-128@6144x2560:2560x4096")
    assert decode.deepgemm_rows() == (16, 128)
    assert decode.deepgemm_shapes() == {(6144, 2560), (2560, 4096)}
    levers._variant("deepgemm")
    assert decode.deepgemm_shapes() is None, "a plain deepgemm takes every shape"
    with pytest.raises(ValueError, match="TTSFLEET_DEEPGEMM_SHAPES='6144'"):
        levers._variant("deepgemm@1-128@6144")


def test_cublas_rows_with_a_pinned_table_keep_rows_65_to_128_on_ours_with_its_tiles(levers):
    """Call 41's variant: ``cublas@129`` keeps batches of 65-128 rows on our GEMM, and the pinned table
    (``tuned_h200_bm128.json``) gives them one 128-row token tile; ``default`` drops both."""
    from ttsfleet.kernels import dispatch, triton_gemm

    table = Path(__file__).resolve().parents[2] / "benchmarks/inference_h200/tuned_h200_bm128.json"
    levers._variant(f"cublas@129+table@{table}")
    plan = dispatch.plan_for_capability((9, 0))
    assert plan.prefill_min_rows == 129 and not plan.large_gemm(128)
    assert triton_gemm.get_config("swiglu", 96, 19456, 2560).bm == 128
    assert triton_gemm.get_config("linear", 64, 6144, 2560).bm == 0, "rows <= 64 keep the shipped pick"
    levers._variant("default")
    assert dispatch.plan_for_capability((9, 0)).prefill_min_rows == 65
    assert triton_gemm.get_config("swiglu", 96, 19456, 2560).bm == 0


@pytest.mark.parametrize("name", ["fp8kv", "fp8kv+deepgemm@33-64", "a16+fp8kv"])
def test_an_fp8kv_variant_decodes_from_the_fp8_cache_whatever_gemm_it_names(levers, name):
    """Its cache kind is read from the whole variant name, not from the GEMM part parsed out of it (until
    2026-12-07 the GEMM's name overwrote the variant's, so ``fp8kv`` timed the bf16 cache)."""
    assert levers._variant(name)["kv"] == "fp8"
    assert levers._variant("deepgemm@33-64")["kv"] == "auto"
