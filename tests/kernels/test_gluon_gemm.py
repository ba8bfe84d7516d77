"""The Gluon FP8 decode GEMM prototype (``kernels/gluon_gemm.py``, issue #26) without a GPU: it imports
anywhere, its config table covers every S2 Pro decode shape and M bucket, the stream-K partition and
split-K fix-up arithmetic it shares with the kernel hold (a Python model of the kernel's schedule,
run on the CPU), and every config the device script runs compiles for sm_90a with the installed
triton -- in a fresh process without ``TRITON_INTERPRET`` (the other kernel tests set it, and
interpreted kernels cannot be compiled). The GPU test checks the kernel against the reference and
skips without an sm_90 device.

Which triton must compile it: the kernel is written against triton 3.6.0 (the H200 image) and
compiles with 3.7.1 too (CI); for those the compile test fails on an error. Another triton whose
Gluon does not compile it is skipped with the error as the reason (Gluon's API is experimental and
changes between releases).
"""

from __future__ import annotations

import importlib.util
import math
import os
import random
import subprocess
import sys

import pytest
from ttsfleet.kernels import gluon_gemm as gg

#: triton releases the kernel was compiled with (here, for sm_90a): a compile failure there is a bug
MUST_COMPILE = ("3.6.", "3.7.")


def test_module_imports_and_says_why_it_cannot_run_here() -> None:
    ok, why = gg.available()
    try:
        import torch

        gpu = torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9
    except ImportError:
        gpu = False
    assert ok == gpu
    assert ok or why  # a reason whenever it is unavailable


def test_the_table_covers_every_s2_shape_and_bucket_with_valid_configs() -> None:
    assert set(gg.S2_SHAPES) == {"qkv", "o", "gate_up", "down"}
    # qkv: 32 query heads + 2 x 8 KV heads of 128 over dim 2560; o: 32 heads of 128 back to 2560
    assert gg.S2_SHAPES["qkv"] == ((32 + 2 * 8) * 128, 2560) and gg.S2_SHAPES["o"] == (32 * 128, 2560)[::-1]
    for n, k in gg.S2_SHAPES.values():
        for m in (1, 2, 7, 8, 9, 16, 17, 32, 33, 64):
            cfg = gg.get_config(n, k, m)
            assert (n, k, gg.m_bucket(m)) in gg.CONFIGS
            gg.check_config(cfg)
            assert cfg.bm >= m or m > 64
    assert gg.m_bucket(65) == 64 and gg.m_bucket(1) == 1
    for m in gg.M_BUCKETS:
        for cfg, _pdl in gg.variants(m).values():
            if cfg is not None:
                gg.check_config(cfg)


@pytest.mark.parametrize("bad", [dict(bn=256), dict(bm=12), dict(bn=64, warps=8), dict(stages=1),
                                 dict(stages=12, bm=64), dict(ctas_per_sm=3), dict(bm=64, warps=4, bn=128)])
def test_check_config_rejects_what_the_kernel_cannot_run(bad: dict) -> None:
    with pytest.raises(ValueError):
        gg.check_config(gg.GluonConfig(**bad))


def _model(n: int, k: int, m: int, cfg: gg.GluonConfig, ctas: int, rng: random.Random,
           values: bool) -> dict[tuple[int, int], float] | None:
    """The kernel's schedule in Python, CTA by CTA in a random order: the ring (stage, phase) of
    every TMA fill and wait, the retire / flush points, the fix-up slots, tickets and sums. With
    ``values`` each unit's block result is a distinct number, so a unit counted twice, lost or
    summed into the wrong tile shows; returns out[(n_tile, m_tile)] (the sum over its units)."""
    bk, stages = gg.BK, cfg.stages
    kb_n = math.ceil(k / bk)
    nt = math.ceil(n / cfg.bn)
    units = nt * math.ceil(m / cfg.bm) * kb_n
    tiles, u_total, most = gg.partition(cfg, n, k, m, ctas)
    assert u_total == units and ctas <= units
    tickets = [0] * tiles
    slots: dict[tuple[int, int], float] = {}
    out: dict[tuple[int, int], float] = {}
    writes = [0] * tiles

    def flush(acc: float, t: int, pid: int) -> None:
        c_first = ((t * kb_n + 1) * ctas - 1) // units
        c_last = ((t * kb_n + kb_n) * ctas - 1) // units
        n_c = c_last - c_first + 1
        key = (t % nt, t // nt)
        if n_c == 1:
            assert c_first == pid
            out[key] = acc
            writes[t] += 1
            return
        slot = pid - c_first
        assert 0 <= slot < most, (slot, most)
        slots[(t, slot)] = acc
        ticket = tickets[t]
        tickets[t] += 1
        if ticket == n_c - 1:
            out[key] = sum(slots[(t, j)] for j in range(n_c))
            tickets[t] = 0
            writes[t] += 1

    order = list(range(ctas))
    rng.shuffle(order)
    seen = [0] * units
    for pid in order:
        u0, u1 = pid * units // ctas, (pid + 1) * units // ctas
        assert u1 > u0
        ring: list[int | None] = [None] * stages  # the unit each stage was last filled with
        fills = [0] * stages  # completed phases per stage barrier
        for b in range(stages):
            if u0 + b < u1:
                ring[b] = u0 + b
                fills[b] += 1

        def consume(u: int, ring=ring, fills=fills, u0=u0) -> float:
            i = u - u0
            s = i % stages
            # the kernel waits for parity (i // STAGES) & 1: the (i // STAGES + 1)-th fill of stage s
            assert fills[s] == i // stages + 1 and ring[s] == u, (u, s, ring, fills)
            seen[u] += 1
            return float(u + 1) if values else 0.0

        def refill(i: int, u1=u1, u0=u0, ring=ring, fills=fills) -> None:
            ps, ru = (i - 1) % stages, u0 + i - 1 + stages
            if ru < u1:
                ring[ps] = ru
                fills[ps] += 1

        acc = 0.0
        pending = consume(u0)
        for u in range(u0 + 1, u1):  # _step(u): MMA u, retire u-1, refill its stage, rescale-add
            nxt = consume(u)
            refill(u - u0)
            acc += pending
            done = u - 1
            if done % kb_n == kb_n - 1 or done == u1 - 1:
                flush(acc, done // kb_n, pid)
                acc = 0.0
            pending = nxt
        acc += pending  # the last unit, retired after wgmma_wait(0)
        flush(acc, (u1 - 1) // kb_n, pid)
    assert seen == [1] * units
    assert writes == [1] * tiles and tickets == [0] * tiles  # one writer per tile, tickets back to 0
    return out if values else None


@pytest.mark.parametrize("n,k,m", [(256, 384, 1), (384, 1000, 17), (200, 640, 70), (128, 128, 8)])
@pytest.mark.parametrize("ctas", [1, 2, 5, 13, 64])
def test_schedule_model_sums_every_unit_into_its_tile_once(n: int, k: int, m: int, ctas: int) -> None:
    rng = random.Random(n * 7919 + ctas)
    cfg = gg.get_config(n, k, m)
    kb_n = math.ceil(k / gg.BK)
    units = math.ceil(n / cfg.bn) * math.ceil(m / cfg.bm) * kb_n
    ctas = min(ctas, units)
    out = _model(n, k, m, cfg, ctas, rng, values=True)
    assert out is not None
    nt = math.ceil(n / cfg.bn)
    for (tn, tm), v in out.items():
        t = tm * nt + tn
        assert v == sum(float(t * kb_n + j + 1) for j in range(kb_n))


@pytest.mark.parametrize("name", sorted(gg.S2_SHAPES))
def test_schedule_model_at_the_s2_shapes_and_h200_grid(name: str) -> None:
    n, k = gg.S2_SHAPES[name]
    for m in gg.M_BUCKETS:
        for cfg, _pdl in gg.variants(m).values():
            cfg = cfg or gg.get_config(n, k, m)
            ctas = gg.grid_size(cfg, n, k, m, gg.H200_SMS)
            _model(n, k, m, cfg, ctas, random.Random(m), values=False)


def _compile(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    return subprocess.run([sys.executable, "-P", "-m", "ttsfleet.kernels.gluon_gemm", "--compile", *args],
                          env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")
def test_representative_configs_compile_for_sm90a() -> None:
    """The smallest and largest token tiles (each a distinct register / shared-memory footprint);
    ``python -m ttsfleet.kernels.gluon_gemm`` compiles all of them (the device script's set)."""
    import triton

    proc = _compile("--bm", "8", "--bm", "64", "--table-only")
    text = proc.stdout + proc.stderr
    if proc.returncode == 3:  # the module says Gluon does not import here
        pytest.skip(f"triton {triton.__version__}: {text.strip()[-300:]}")
    if proc.returncode != 0 and not triton.__version__.startswith(MUST_COMPILE):
        pytest.skip(f"triton {triton.__version__}'s Gluon does not compile the prototype (written for 3.6): "
                    + text.strip()[-400:])
    assert proc.returncode == 0, text[-4000:]
    assert "2 of 2 configs compiled for sm_90a" in proc.stdout


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 8, 33, 64])
@pytest.mark.parametrize("n,k", [(256, 384), (6144, 2560), (2560, 4096)])
def test_gpu_matches_the_reference_and_replays_from_a_graph(gen, n: int, k: int, m: int) -> None:  # noqa: ANN001
    ok, why = gg.available()
    if not ok:
        pytest.skip(why)
    import torch
    from ttsfleet.kernels.reference import linear_fp8_codes_ref, quantize_activation_ref, quantize_weight_ref
    from ttsfleet.kernels.testing import TOL_SAME_CODES_BF16, randn, rel_err

    qw = quantize_weight_ref(randn(gen, n, k, scale=k ** -0.5, device="cuda"), "bsgemm_fp8")
    xq, xs = quantize_activation_ref(randn(gen, m, k, device="cuda", dtype=torch.bfloat16))
    ref = linear_fp8_codes_ref(xq, xs, qw, torch.float32)
    out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    gg.gluon_linear_fp8_codes(xq, xs, qw, torch.bfloat16, out=out)
    assert rel_err(out, ref) < TOL_SAME_CODES_BF16
    assert torch.equal(gg.gluon_linear_fp8_codes(xq, xs, qw), out)  # split-K sums in slot order
    from ttsfleet.kernels.workspaces import new_owner, workspace_scope

    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    gout = torch.full_like(out, float("nan"))
    with workspace_scope(new_owner("test-gluon")):  # the graph shares the eager launch's workspace
        with torch.cuda.stream(s):
            gg.gluon_linear_fp8_codes(xq, xs, qw)  # the workspace, made outside the capture
        s.synchronize()
        with torch.cuda.graph(g, stream=s):
            gg.gluon_linear_fp8_codes(xq, xs, qw, out=gout)
    for _ in range(2):  # the tickets reset themselves: replays give the same result
        gout.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(gout, out)
