"""Every Triton kernel the decode step can launch compiles for sm_90 (H200) and sm_120 (RTX 5090 /
RTX PRO 6000), here, without a GPU, and holds what that arch is for (``kernels/compile_check.py``).

CI compiles the representative set (the tuned picks and one config per kernel structure; the
next test shows it covers every structure of the full space); the whole space is
``python -m ttsfleet.kernels.compile_check`` (benchmarks/kernels/compile_report_2026-12-01.txt).
Runs the check in a fresh process per arch: the other kernel tests put Triton in interpreter mode
for this process, and interpreted kernels cannot be compiled. (triton is not imported at module
level: it reads ``TRITON_INTERPRET`` once, when first imported, which other modules set.) The
checks themselves are unit-tested on hand-made PTX, so each rule is seen to fail once.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest

if importlib.util.find_spec("triton") is None:
    pytest.skip("triton is not installed", allow_module_level=True)


def _run(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    return subprocess.run([sys.executable, "-P", "-m", "ttsfleet.kernels.compile_check", *args], env=env,
                          capture_output=True, text=True, timeout=1200)


@pytest.mark.parametrize("arch", ["90", "120"])
def test_every_tunable_gemm_config_and_decode_kernel_compiles(arch: str) -> None:
    proc = _run("--arch", arch, "--representative")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"compiled for sm_{arch} as configured" in proc.stdout


def test_the_representative_set_has_every_structure_and_every_tuned_pick() -> None:
    from ttsfleet.kernels import triton_gemm as tg
    from ttsfleet.kernels.compile_check import S2_SHAPES, TARGETS, _gemm_configs

    def structures(cases):  # noqa: ANN001, ANN202
        return {(kind == "swiglu", c.bn, c.swap, c.bm, c.num_warps, c.num_stages, c.tma, c.split_k > 1)
                for kind, c, _, _ in cases}

    for scheme in {s for t in TARGETS.values() for s in t.schemes}:
        full, rep = list(_gemm_configs(scheme)), list(_gemm_configs(scheme, representative=True))
        assert len(rep) < len(full) / 2 and structures(rep) == structures(full)
        picked = {(kind, c, m, k) for kind, c, m, k in rep}
        for kind, n, k in S2_SHAPES:
            for m in (1, 32, 64):
                assert any(p[0] == kind and p[1] == tg.get_config(kind, m, n, k) and p[3] == k
                           for p in picked), (scheme, kind, m)


def test_a_bad_arch_is_a_usage_error() -> None:
    proc = _run("--arch", "80")
    assert proc.returncode == 2 and "invalid choice" in proc.stderr


def test_each_rule_fails_on_ptx_that_breaks_it() -> None:
    from ttsfleet.kernels.compile_check import TARGETS, Compiled, _common

    sm90, sm120 = TARGETS[90], TARGETS[120]
    ok = "griddepcontrol.wait;\nmma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32"
    assert _common(Compiled(ok, 1024, b""), sm120) == []
    assert _common(Compiled(ok + "\nwgmma.mma_async.sync", 0, b""), sm120) == ["has wgmma (not on sm_120a)"]
    assert _common(Compiled(ok + "\ntcgen05.mma", 0, b""), sm120) == ["has tcgen05 (not on sm_120a)"]
    assert _common(Compiled("mma.sync", 0, b""), sm90) == ["no griddepcontrol.wait"]
    assert _common(Compiled("mma.sync", 0, b""), sm90, pdl=False) == []
    # 99 KiB per block on sm_120 (100 KiB per SM less 1 KiB reserved), 227 KiB on sm_90
    assert _common(Compiled(ok, 99 * 1024 + 1, b""), sm120) == [
        f"{99 * 1024 + 1} B shared memory > {99 * 1024} B per block on sm_120a"]
    assert _common(Compiled(ok, 99 * 1024 + 1, b""), sm90) == []
    assert sm90.gemm_mma == "wgmma.mma_async" and "mma.sync" in sm120.gemm_mma


def test_the_weight_prefetch_rule_fails_on_ptx_that_breaks_it() -> None:
    """``TTSFLEET_GEMM_PREFETCH``'s compiled form: one L2 bulk prefetch per weight half, before the PDL
    wait, and none when the launch asks for none."""
    from ttsfleet.kernels.compile_check import PREFETCH_OP, _prefetch_bad

    wait = "griddepcontrol.wait;"
    assert _prefetch_bad(f"{PREFETCH_OP} [a], b;\n{wait}", 4, 0) == []
    assert _prefetch_bad(f"{PREFETCH_OP} [a], b;\n{PREFETCH_OP} [c], d;\n{wait}", 4, 1) == []
    assert _prefetch_bad(wait, 0, 1) == []
    late = f"{wait}\n{PREFETCH_OP} [a], b;"
    assert _prefetch_bad(late, 4, 0) == ["an L2 prefetch after griddepcontrol.wait"]
    assert _prefetch_bad(f"{PREFETCH_OP} [a], b;\n{wait}", 4, 1) == ["1 L2 prefetches, expected 2"]
    assert _prefetch_bad(wait, 4, 0) == ["0 L2 prefetches, expected 1"]
    assert _prefetch_bad(f"{PREFETCH_OP} [a], b;\n{wait}", 0, 0) == ["1 L2 prefetches with PREFETCH=0"]
