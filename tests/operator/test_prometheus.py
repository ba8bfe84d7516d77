"""PromQL signals against a real Prometheus scraping real inference /metrics endpoints."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import yaml
from ttsfleet.devtools.ports import free_port
from ttsfleet.operator.inference import Memory, measure
from ttsfleet.operator.models import TTSDeploymentSpec
from ttsfleet.operator.signals import PrometheusSource

from tests.operator.helpers import ttsd
from ttsfleet.catalog import GpuCatalog

CAT = GpuCatalog.default()

pytestmark = [pytest.mark.prometheus,
              pytest.mark.skipif(shutil.which("prometheus") is None, reason="needs a prometheus binary")]


@contextlib.asynccontextmanager
async def prometheus(tmp: Path, targets: dict[str, tuple[int, dict[str, str]]]) -> AsyncIterator[str]:
    port = free_port()
    cfg = {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
           "scrape_configs": [{"job_name": name, "static_configs": [
               {"targets": [f"127.0.0.1:{p}"], "labels": labels}]} for name, (p, labels) in targets.items()]}
    (tmp / "prometheus.yml").write_text(yaml.safe_dump(cfg))
    proc = subprocess.Popen(["prometheus", f"--config.file={tmp / 'prometheus.yml'}",
                             f"--storage.tsdb.path={tmp / 'data'}", f"--web.listen-address=127.0.0.1:{port}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=20)


async def test_promql_measures_one_pool(tmp_path, metrics_servers) -> None:
    h200, other = await metrics_servers(), await metrics_servers()
    h200.set(in_flight=12, queue=3)
    other.set(in_flight=100, queue=50)  # another deployment's pod: must not be counted
    targets = {"a": (h200.port, {"namespace": "ns1", "pod": "voice-h200-5d9f8-abcde"}),
               "b": (other.port, {"namespace": "ns1", "pod": "voice2-h200-6c7d-fghij"})}
    async with prometheus(tmp_path, targets) as url, httpx.AsyncClient() as client:
        source = PrometheusSource(client, url)
        got = None
        for _ in range(60):  # first scrapes land a few seconds after start
            h200.set(in_flight=12, queue=3, ttfa=[0.28] * 10)
            await asyncio.sleep(0.5)
            try:
                got = await source.measure("ns1", "voice-h200", 15)
            except httpx.HTTPError:
                continue
            if got.in_flight and got.ttfa_p99_s is not None:
                break
        assert got is not None
        assert got.in_flight == 12 and got.queue_depth == 3
        assert dict(got.per_pod_in_flight) == {"voice-h200-5d9f8-abcde": 12}
        assert 0.25 < got.ttfa_p99_s <= 0.3

        # The operator's measuring step picks PromQL when TTSFLEET_PROMETHEUS_URL is set.
        class Rt:
            prometheus_url = url
            http = client
        spec = TTSDeploymentSpec.model_validate(ttsd()["spec"], context={"catalog": CAT})
        by_pool = await measure(Rt(), Memory(), "ns1", "voice", spec, [])  # type: ignore[arg-type]
        assert by_pool["h200"].in_flight == 12  # voice2-h200-* belongs to another deployment
        assert by_pool["rtx5090"].in_flight == 0  # no rtx5090 pod is scraped
