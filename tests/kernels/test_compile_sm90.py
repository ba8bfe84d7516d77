"""Every Triton kernel the decode step can launch compiles for sm_90, here, without a GPU.

Runs :mod:`ttsfleet.kernels.compile_check` in a fresh process: the other kernel tests put Triton in
interpreter mode for this process, and interpreted kernels cannot be compiled. (triton is not
imported here: it reads ``TRITON_INTERPRET`` once, when first imported, which other modules set.)
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest

if importlib.util.find_spec("triton") is None:
    pytest.skip("triton is not installed", allow_module_level=True)


def test_every_tunable_gemm_config_and_decode_kernel_compiles_for_sm90() -> None:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-P", "-m", "ttsfleet.kernels.compile_check"], env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "compiled for sm_90" in proc.stdout
