"""Live scrape: the real Slurm exporter, a real Prometheus, the shipped rules and Slurm panels.

The one live-scrape test of this suite. The exporter (``ttsfleet.slurm.exporter.SlurmExporter``)
polls a small in-memory backend with known nodes and jobs; Prometheus scrapes it every second with
the chart's rules file loaded, so this also proves the rules load and evaluate on live data.

The waits follow Prometheus' own cadence, not a guess: the first scrape comes once target
discovery hands the target over (Prometheus throttles those updates to every 5 s) plus a scrape
interval; the rule groups evaluate every ``interval`` (read back from ``/api/v1/rules``) at an offset
of their own, so the first evaluation that sees data can come up to two intervals after the first
scrape. A fixed 30 s wait failed whenever it came late. The shipped groups' 30 s interval would make
that wait up to a minute: Prometheus loads a copy of the shipped file whose only change is that
interval, :data:`RULE_INTERVAL_S` (the copy is checked to be the shipped rules otherwise).
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


#: Prometheus hands discovered targets to the scrape loops at most every 5 s (discovery's updatert).
DISCOVERY_UPDATE_S = 5.0
SCRAPE_S = 1.0
#: Added to every bound below: Prometheus and this test sharing a loaded machine with others.
SLACK_S = 20.0
#: The evaluation interval of the rule groups in the copy Prometheus loads (shipped: 30 s).
RULE_INTERVAL_S = 2


def _rules_evaluating_every(interval_s: int, tmp_path: Path) -> Path:
    """The shipped rules file with the 30 s interval of its groups set to ``interval_s`` (groups without
    one keep the global evaluation interval); nothing else differs."""
    import yaml

    shipped = yaml.safe_load((build.REPO_ROOT / build.RULES_PATH).read_text())
    timed = [g for g in shipped["groups"] if "interval" in g]
    assert timed and all(g["interval"] == "30s" for g in timed)
    copy = {**shipped, "groups": [{**g, "interval": f"{interval_s}s"} if "interval" in g else g
                                  for g in shipped["groups"]]}
    assert [{k: v for k, v in g.items() if k != "interval"} for g in copy["groups"]] == \
        [{k: v for k, v in g.items() if k != "interval"} for g in shipped["groups"]]
    path = tmp_path / "ttsfleet-rules.yaml"
    path.write_text(yaml.safe_dump(copy, sort_keys=False))
    return path


def _wait(cond, bound: float, what: str, state) -> None:
    """Poll ``cond`` for ``bound`` seconds; on failure report what Prometheus says (``state()``)."""
    deadline = time.monotonic() + bound
    while not cond():
        if time.monotonic() > deadline:
            pytest.fail(f"no {what} within {bound:.0f} s: {state()}")
        time.sleep(0.5)


def _rule_group(prom: Prometheus, record: str) -> dict:
    return next(g for g in prom.api("rules")["groups"] if any(r.get("name") == record for r in g["rules"]))


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
        rules = _rules_evaluating_every(RULE_INTERVAL_S, tmp_path)
        with Prometheus(tmp_path / "data", config, (rules,)) as prom:
            record = "ttsfleet:gpu_utilization_allocated:ratio"
            group = _rule_group(prom, record)  # the shipped rules loaded
            assert group["interval"] == RULE_INTERVAL_S, group["interval"]  # what the bound below is made of

            def targets() -> list:
                return [(t["health"], t["lastScrape"]) for t in prom.api("targets")["activeTargets"]]

            _wait(lambda: len(prom.query("ttsfleet_slurm_up", time.time())) == 1,
                  DISCOVERY_UPDATE_S + 2 * SCRAPE_S + SLACK_S, "first scrape", targets)

            def evaluated() -> bool:
                now = time.time()
                return bool(prom.query(record, now)
                            and prom.query("count_over_time(ttsfleet_slurm_up[1m]) >= 2", now))

            _wait(evaluated, 2 * group["interval"] + 2 * SCRAPE_S + SLACK_S, f"evaluation of {record}",
                  lambda: {k: _rule_group(prom, record)[k] for k in ("lastEvaluation", "interval")})
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
