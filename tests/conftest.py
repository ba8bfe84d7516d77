"""Shared test configuration: skip GPU/system-service tests cleanly where they cannot run."""

from __future__ import annotations

import os
import shutil

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
