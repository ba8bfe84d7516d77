"""Shared test configuration: skip GPU/system-service tests cleanly where they cannot run."""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import shutil
import sys

import pytest


def _interpret_triton_without_a_gpu() -> None:
    """Without CUDA the kernel tests run Triton's interpreter, which Triton takes from
    ``TRITON_INTERPRET`` as it is imported: ``triton.language``'s own functions are decorated then.
    Each interpreter test module sets it at its top, but a module collected before them that imports
    triton (``torch._dynamo`` does) would decorate those functions for compiling, and every
    interpreted kernel then fails on its first ``tl.sum`` (108 tests of a clean-clone run on
    2026-12-03, after a codec test imported ``torch._dynamo.testing``). Set here, before any test
    module is collected. Importing torch does not import triton."""
    try:
        import torch
    except ImportError:
        return
    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")


_interpret_triton_without_a_gpu()


SANITIZE_OVERFLOW = "TTSFLEET_TRITON_SANITIZE_OVERFLOW"


def _interpreter_without_overflow_checks() -> None:
    """Triton's interpreter checks every 32-bit integer add / sub / mul of a kernel for overflow
    (``InterpreterOptions.sanitize_overflow``, one int64 recomputation + a device assert per op):
    half the time of an index-heavy kernel such as the codec's Snake, a quarter of a GEMM's. A
    compiled kernel has no such check unless built with ``debug``, and at the tests' tiny shapes no
    index comes near 2**31; a wrong one still shows as a wrong result. So off here; set
    ``TTSFLEET_TRITON_SANITIZE_OVERFLOW=1`` to have it back. The interpreter's options are one
    module-level builder's, read as each kernel runs: patched before the first test that has torch
    loaded (triton's import is cheap then, and safe: ``TRITON_INTERPRET`` is set above)."""
    if os.environ.get("TRITON_INTERPRET") != "1" or os.environ.get(SANITIZE_OVERFLOW) == "1":
        return
    interp = sys.modules.get("triton.runtime.interpreter")
    if interp is None:
        if "torch" not in sys.modules or importlib.util.find_spec("triton") is None:
            return
        import triton.runtime.interpreter as interp
    builder = getattr(interp, "interpreter_builder", None)
    options = getattr(builder, "options", None)
    if getattr(options, "sanitize_overflow", False):
        builder.options = dataclasses.replace(options, sanitize_overflow=False)


@pytest.fixture(autouse=True)
def _fast_triton_interpreter():  # noqa: ANN202
    _interpreter_without_overflow_checks()
    yield


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    cuda = False
    try:
        import torch

        cuda = torch.cuda.is_available()
    except Exception:  # torch not installed: GPU tests skip
        cuda = False
    skip_gpu = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords and not cuda:
            item.add_marker(skip_gpu)
        if "audio" in item.keywords and shutil.which("espeak-ng") is None:
            item.add_marker(pytest.mark.skip(reason="needs espeak-ng (installed by .ci/run)"))
