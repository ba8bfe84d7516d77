"""Fixtures for the DualAR model / codec / tokenizer tests: golden fixture paths and tiny models."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

GOLDEN = Path(__file__).resolve().parents[1] / "fixtures" / "fish-golden"


@pytest.fixture(scope="session")
def golden_dir() -> Path:
    return GOLDEN


@pytest.fixture(scope="session")
def golden() -> Callable[[str], dict[str, Any]]:
    """``golden("s2-tiny")`` -> that fixture's golden.json."""
    return lambda name: json.loads((GOLDEN / name / "golden.json").read_text())


@pytest.fixture
def fused_kernels():  # noqa: ANN201
    """The fused (Triton) kernels for one test: through Triton's interpreter on a CPU (the test module
    sets ``TRITON_INTERPRET=1`` before triton is first imported), the device's plan on CUDA; then
    back to what ``TTSFLEET_KERNELS`` says."""
    from ttsfleet.kernels import dispatch

    cpu = not torch.cuda.is_available()
    if cpu and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("triton was imported before TRITON_INTERPRET could be set")
    dispatch.configure("interpret" if cpu else "auto")
    yield
    dispatch.configure()


@pytest.fixture(scope="session")
def tiny_model():
    from ttsfleet.inference.loader import load_model

    return load_model("tiny")


@pytest.fixture(scope="session")
def tiny_tok():
    from ttsfleet.inference.loader import load_tokenizer

    return load_tokenizer("tiny")


@pytest.fixture(autouse=True)
def _few_threads():
    # 2 shared cores: keep torch from oversubscribing them.
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


def _triton_interprets() -> bool:
    """Whether this process runs Triton kernels through the interpreter (CPU, TRITON_INTERPRET=1 set
    before triton was imported)."""
    if torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") != "1":
        return False
    from ttsfleet.kernels import triton_gemm

    return triton_gemm.INTERPRETING


@pytest.fixture(params=["reference", "interpret"])
def kernels(request: pytest.FixtureRequest):  # noqa: ANN201
    """The torch reference, then Triton's interpreter (skipped where it is not active): the fused
    codec kernels' tests run through both."""
    from ttsfleet.kernels import dispatch

    if request.param == "interpret" and not _triton_interprets():
        pytest.skip("Triton's interpreter is not active in this process")
    dispatch.configure(request.param)
    yield request.param
    dispatch.configure()
