"""Fixtures for the kernel tests: fresh random inputs every run (seed printed for replay)."""

from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")


@pytest.fixture
def gen() -> torch.Generator:
    """A freshly seeded generator; set TTSFLEET_TEST_SEED to replay a failure."""
    seed = int(os.environ.get("TTSFLEET_TEST_SEED", "0")) or int.from_bytes(os.urandom(4), "little")
    print(f"seed={seed}")
    return torch.Generator().manual_seed(seed)
