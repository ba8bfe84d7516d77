"""Fixtures: the demo fleet's data backfilled into a real Prometheus (one per test session)."""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from ttsfleet.devtools.promserver import Prometheus, backfill

from ttsfleet.observability import demo as demo_mod


@pytest.fixture(scope="session")
def demo() -> demo_mod.DemoData:
    # Start on a whole hour, four hours ago: inside any retention, independent of the wall clock.
    start = (int(time.time()) // 3600 - 4) * 3600
    return demo_mod.generate(start)


@pytest.fixture(scope="session")
def prom(demo: demo_mod.DemoData, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prometheus]:
    if shutil.which("prometheus") is None or shutil.which("promtool") is None:
        pytest.skip("needs Debian's prometheus and promtool")
    work: Path = tmp_path_factory.mktemp("prom")
    data = backfill(demo.openmetrics, work)
    with Prometheus(data) as p:
        yield p
