"""Shared test configuration: skip GPU/system-service tests cleanly where they cannot run."""

from __future__ import annotations

import shutil

import pytest


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
