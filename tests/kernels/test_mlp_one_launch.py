"""The one-launch SwiGLU MLP (``TTSFLEET_MLP_LAUNCH=one``; ``kernels/triton_mlp.py``).

Its claim: the gate_up and down GEMMs' tiles run as work items of one persistent launch and give the
values of the two launches with the same tiles and splits, bit for bit (the same tile code), leaving
the work counters at zero (CUDA-graph replayable). Runs in Triton's interpreter on CPU (programs one
after another, so the first program takes every item: the ticket order and the counters are what is
checked) and compiled on a GPU (programs at once: the waits are real there).
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

from ttsfleet.kernels import decode  # noqa: E402
from ttsfleet.kernels.layout import cdiv  # noqa: E402
from ttsfleet.kernels.ops import quantize_weight, swiglu_mlp_fp8_codes  # noqa: E402
from ttsfleet.kernels.reference import quantize_activation_ref, swiglu_mlp_fp8_codes_ref  # noqa: E402
from ttsfleet.kernels.testing import graph_replays_equal, randn, rel_err  # noqa: E402
from ttsfleet.kernels.workspaces import new_owner, workspace, workspace_scope  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
S2_D, S2_F = 2560, 9728


pytestmark = pytest.mark.usefixtures("kernels_on")  # the interpreter on CPU, compiled on a GPU


def _tm():  # noqa: ANN202
    from ttsfleet.kernels import triton_mlp

    return triton_mlp


def _tg():  # noqa: ANN202
    from ttsfleet.kernels import triton_gemm

    return triton_gemm


def test_the_s2_pro_plan_puts_every_down_item_beside_gate_up() -> None:
    """At M=1 on 132 SMs: 76 gate_up items and 20 down tiles x 2 shares, all taken at once, so each
    down item prefetches its weights while gate_up runs; each share keeps >= 2 K blocks."""
    plan = _tm().one_launch_plan(1, S2_D, S2_F, 128, 132)
    split = (plan.bm, plan.gu_tiles, plan.gu_split, plan.dn_bn, plan.dn_tiles, plan.dn_split)
    assert split == (16, 76, 1, 128, 20, 2)
    assert plan.items == 116 == plan.programs
    for m, group in ((1, 128), (8, 32), (33, 128), (64, 32)):
        p = _tm().one_launch_plan(m, S2_D, S2_F, group, 132)
        assert p.items <= 132 and p.programs == p.items
        assert cdiv(cdiv(S2_F, group), p.dn_split) >= 2
        assert p.bm >= m and p.num_warps == (8 if p.bm >= 32 else 4)
    assert _tm().one_launch_plan(65, S2_D, S2_F, 128, 132) is None
    few = _tm().one_launch_plan(1, S2_D, S2_F, 128, 8)  # fewer SMs than items: programs loop
    assert few.programs == 8 and few.dn_split == 1 and few.items == 76 + 20
    two_per_sm = _tm().one_launch_plan(1, S2_D, S2_F, 128, 132, gu_split=3, per_sm=2)  # the launches' grid
    assert (two_per_sm.gu_split, two_per_sm.dn_split) == (3, 1)
    assert two_per_sm.items == two_per_sm.programs == 248


def _weights(gen: torch.Generator, scheme: str, d: int, f: int) -> tuple:
    gu = quantize_weight(randn(gen, 2 * f, d, scale=d ** -0.5, device=DEV), scheme)
    dn = quantize_weight(randn(gen, d, f, scale=f ** -0.5, device=DEV), scheme)
    return gu, dn


def _two_launches(xq, xs, gu, dn, plan, scheme: str) -> torch.Tensor:  # noqa: ANN001
    """The gate_up and down launches with the plan's tiles and splits."""
    tg = _tg()
    m, f = xq.shape[0], gu.shape[0] // 2
    group = tg.act_group(scheme)
    hq = torch.empty(m, f, device=DEV, dtype=torch.float8_e4m3fn)
    hs = torch.empty(m, cdiv(f, group), device=DEV, dtype=torch.uint8 if scheme == "mxfp8" else torch.float32)
    common = dict(swap=True, num_warps=plan.num_warps, num_stages=3, tma=True)
    gate_up = tg.GemmConfig(bn=128, split_k=plan.gu_split, **common)
    tg.launch_gemm(xq, xs, gu, hq, None, gate_up, epi=1, h_scale=hs)
    out = torch.empty(m, dn.shape[0], device=DEV, dtype=torch.bfloat16)
    tg.launch_gemm(hq, hs, dn, out, None, tg.GemmConfig(bn=plan.dn_bn, split_k=plan.dn_split, **common))
    return out


@pytest.mark.parametrize("scheme", ["bsgemm_fp8", "mxfp8"])
@pytest.mark.parametrize("m,gu_split,dn_split,programs", [
    (1, 1, 1, 4), (3, 2, 3, 5), (17, 1, 2, 64), (5, 3, 1, 1)])
def test_one_launch_equals_two_launches_with_its_tiles(scheme: str, m: int, gu_split: int, dn_split: int,
                                                        programs: int, gen: torch.Generator) -> None:
    """Bit for bit, for split and unsplit gate_up (the fix-up program counts the h tile) and down,
    fewer programs than items and more, one row and a partial 32-row tile; then the counters and
    tickets are all zero again and a second launch gives the same bits."""
    tm, tg = _tm(), _tg()
    d, f = 512, 384  # 3 h tiles; 4 / 12 K blocks of the down GEMM (1x128 / 1x32)
    gu, dn = _weights(gen, scheme, d, f)
    xq, xs = quantize_activation_ref(randn(gen, m, d, dtype=torch.bfloat16), tg.act_group(scheme))
    xq, xs = xq.to(DEV), xs.to(DEV)
    base = tm.one_launch_plan(m, d, f, tg.act_group(scheme), programs, gu_split=gu_split)
    plan = tm.OneLaunchPlan(**{**base.__dict__, "dn_split": dn_split, "programs": programs})
    got = tm.swiglu_mlp_one_launch(xq, xs, gu, dn, torch.bfloat16, plan=plan)
    want = _two_launches(xq, xs, gu, dn, plan, scheme)
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))
    _, tickets = workspace(xq.device, 1, 1)
    assert int(tickets.abs().sum()) == 0, "a ticket or work counter was left set"
    again = tm.swiglu_mlp_one_launch(xq, xs, gu, dn, torch.bfloat16, plan=plan)
    assert torch.equal(again.view(torch.int16), got.view(torch.int16))
    assert rel_err(got, swiglu_mlp_fp8_codes_ref(xq, xs, gu, dn, torch.bfloat16)) < 2e-2


def test_the_switch_routes_decode_rows_only(gen: torch.Generator, monkeypatch: pytest.MonkeyPatch) -> None:
    """``one``: rows <= 64 take the one launch (any leading shape), more rows two launches; ``two``
    (the default) never takes it."""
    tm = _tm()
    calls: list[int] = []
    real = tm.swiglu_mlp_one_launch

    def counted(xq, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        calls.append(xq.shape[0])
        return real(xq, *args, **kwargs)

    monkeypatch.setattr(tm, "swiglu_mlp_one_launch", counted)
    d, f = 256, 128
    gu, dn = _weights(gen, "bsgemm_fp8", d, f)
    assert decode.MLP_LAUNCH_SWITCH.default == "two"
    for mode, rows, taken in (("two", 2, []), ("one", 2, [2]), ("one", 65, [])):
        calls.clear()
        decode.set_mlp_launch(mode)
        xq, xs = quantize_activation_ref(randn(gen, rows, d, dtype=torch.bfloat16), 128)
        xq, xs = xq.to(DEV).view(1, rows, d), xs.to(DEV).view(1, rows, -1)
        out = swiglu_mlp_fp8_codes(xq, xs, gu, dn, torch.bfloat16)
        assert calls == taken, (mode, rows)
        assert out.shape == (1, rows, d)
        assert rel_err(out, swiglu_mlp_fp8_codes_ref(xq, xs, gu, dn, torch.bfloat16)) < 2e-2


def test_more_rows_than_one_tile_are_refused(gen: torch.Generator) -> None:
    gu, dn = _weights(gen, "bsgemm_fp8", 256, 128)
    xq, xs = quantize_activation_ref(randn(gen, 65, 256, dtype=torch.bfloat16), 128)
    with pytest.raises(ValueError, match="M <= 64"):
        _tm().swiglu_mlp_one_launch(xq.to(DEV), xs.to(DEV), gu, dn, torch.bfloat16)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (graph capture)")
def test_a_cuda_graph_of_it_replays_the_eager_result(gen: torch.Generator) -> None:
    """The counters return to zero at the end of every launch, so a captured launch replays: three
    replays of a graph holding two launches give the eager bits (a counter left set would make a
    replay skip its items or spin forever: the pytest timeout catches that)."""
    gu, dn = _weights(gen, "bsgemm_fp8", S2_D, S2_F)
    xq, xs = quantize_activation_ref(randn(gen, 4, S2_D, dtype=torch.bfloat16), 128)
    xq, xs = xq.to(DEV), xs.to(DEV)
    owner = new_owner("test-mlp-graph")  # the graph's workspace, read back below
    launch = lambda: _tm().swiglu_mlp_one_launch(xq, xs, gu, dn, torch.bfloat16)  # noqa: E731
    assert graph_replays_equal(launch, owner=owner)
    with workspace_scope(owner):
        assert int(workspace(xq.device, 1, 1)[1].abs().sum()) == 0
