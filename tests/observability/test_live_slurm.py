"""Live scrape: the real Slurm exporter, a real Prometheus, the shipped rules and Slurm panels.

The one live-scrape test of this suite (first scrape lands ~6 s after Prometheus starts). The
exporter (``ttsfleet.slurm.exporter.SlurmExporter``) polls a small in-memory backend with known
nodes and jobs; Prometheus scrapes it every second with the chart's rules file loaded, so this
also proves the rules load and evaluate on live data.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest
from ttsfleet.devtools.ports import free_port
from ttsfleet.devtools.promserver import Prometheus

from ttsfleet.observability import build
from ttsfleet.observability.definitions import slurm

exporter_mod = pytest.importorskip("ttsfleet.slurm.exporter")
backend_mod = pytest.importorskip("ttsfleet.slurm.backend")

pytestmark = [pytest.mark.prometheus, pytest.mark.slow,
              pytest.mark.skipif(shutil.which("prometheus") is None, reason="needs prometheus")]


class MemoryBackend:
    """Two nodes (4x h200, 2x rtx5090) and six jobs; enough of the SlurmBackend protocol."""

    name = "memory"
    restarts = 0  # restart count of the running fill job; raising it is a preemption + requeue

    def ping(self) -> None:
        return None

    def nodes(self) -> list:
        N = backend_mod.NodeInfo
        return [N("n1", frozenset({"MIXED"}), ("train", "fill"), {"h200": 4}),
                N("n2", frozenset({"MIXED"}), ("fill",), {"rtx5090": 2})]

    def partitions(self) -> list:
        P = backend_mod.PartitionInfo
        return [P("train", ("n1",), 10, "OFF", 0, "UP"), P("fill", ("n1", "n2"), 1, "REQUEUE", 30, "UP")]

    def jobs(self) -> list:
        J = backend_mod.JobInfo
        return [J("1", "train-a", "train", "RUNNING", gpus=2, gpu_class="h200", nodes="n1"),
                J("2", "fill-a", "fill", "RUNNING", gpus=1, gpu_class="h200", nodes="n1",
                  restart_count=self.restarts),
                J("3", "fill-b", "fill", "RUNNING", gpus=1, gpu_class="rtx5090", nodes="n2"),
                J("4", "train-b", "train", "PENDING", gpus=4, gpu_class="h200"),
                J("5", "fill-c", "fill", "PENDING", gpus=1),
                J("6", "fill-d", "fill", "PENDING", gpus=1)]


def _vec(rows: list[dict], label: str | None) -> dict[str, float]:
    return {(r["metric"].get(label, "") if label else ""): r["value"] for r in rows}


def test_slurm_exporter_scraped_live(tmp_path: Path) -> None:
    from prometheus_client import start_http_server

    backend = MemoryBackend()
    exp = exporter_mod.SlurmExporter(backend)
    assert exp.poll()
    backend.restarts = 1  # the fill job was preempted and requeued once: counters now exist
    assert exp.poll()
    port = free_port()
    server, thread = start_http_server(port, addr="127.0.0.1", registry=exp.registry)
    try:
        (tmp_path / "data").mkdir()
        config = ("global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
                  "scrape_configs:\n  - job_name: slurm\n    static_configs:\n"
                  f"      - targets: ['127.0.0.1:{port}']\n")
        with Prometheus(tmp_path / "data", config, (build.REPO_ROOT / build.RULES_PATH,)) as prom:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                now = time.time()
                if (len(prom.query("ttsfleet_slurm_up", now)) == 1
                        and prom.query("ttsfleet:gpu_utilization_allocated:ratio", now)
                        and prom.query("count_over_time(ttsfleet_slurm_up[1m]) >= 2", now)):
                    break
                time.sleep(0.5)
            else:
                pytest.fail("no live scrape and rule evaluation within 30 s")
            now = time.time()
            # Fill shard submissions come from the fill agent, not the exporter.
            q = {t.legend + "|" + p.title: t.expr.replace("$gpu_class", ".*")
                 for p in slurm().panels() for t in p.targets if "fill_submissions" not in t.expr}
            got = {k: prom.query(expr, now) for k, expr in q.items()}
            assert all(got.values()), [k for k, v in got.items() if not v]
            assert _vec(got["{{partition}}|Allocated GPUs per partition"], "partition") == \
                {"train": 2, "fill": 2}
            assert _vec(got["{{gpu_class}}|Idle GPUs per GPU class"], "gpu_class") == \
                {"h200": 1, "rtx5090": 1}
            assert _vec(got["{{partition}}|Pending jobs per partition"], "partition") == \
                {"train": 1, "fill": 2}
            assert _vec(got["{{partition}}|Running jobs per partition"], "partition") == \
                {"train": 1, "fill": 2}
            assert _vec(got["up|Exporter up"], None) == {"": 1}
            # The exporter creates every partition's counters (at 0 before any event); the requeue
            # happened before the first scrape, so the 10-minute increase still reads 0 here.
            for key in ("{{partition}} preempted|Preemptions and requeues (10 min)",
                        "{{partition}} requeued|Preemptions and requeues (10 min)"):
                assert _vec(got[key], "partition") == {"fill": 0.0, "train": 0.0}
            raw = _vec(prom.query("ttsfleet_slurm_requeues_total", now), "partition")
            assert raw == {"fill": 1.0, "train": 0.0}
            # The shipped recording rules, evaluated live on the exporter's fleet gauges.
            ratio = _vec(prom.query("ttsfleet:gpu_utilization_allocated:ratio", now), "gpu_class")
            assert ratio == {"h200": pytest.approx(3 / 4), "rtx5090": pytest.approx(1 / 2)}
    finally:
        server.shutdown()
        thread.join(timeout=5)
