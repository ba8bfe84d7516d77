"""The metric contract: unique, conventional names, and no metric invented elsewhere."""

from __future__ import annotations

import re
from pathlib import Path

from prometheus_client import generate_latest

from ttsfleet import metrics

ROOT = Path(__file__).resolve().parents[2]


def test_names_are_unique_and_conventional():
    names = [m.name for m in metrics.CONTRACT_LIST]
    assert len(names) == len(set(names))
    for m in metrics.CONTRACT_LIST:
        assert re.fullmatch(r"ttsfleet_[a-z0-9_]+", m.name), m.name
        if m.type == "counter":
            assert not m.name.endswith("_total"), "counters get _total from prometheus-client"
        if m.type == "histogram":
            assert m.buckets and list(m.buckets) == sorted(m.buckets)
        assert m.help.strip()


def test_make_collectors_exposes_contract_names():
    c = metrics.make_collectors(["inference", "core"])
    c["inference_requests_in_flight"].labels(model="tiny").set(3)
    c["inference_ttfa_seconds"].labels(model="tiny").observe(0.08)
    c["gpus"].labels(gpu_class="h200", workload="fill").set(7)
    text = generate_latest(c.registry).decode()
    assert 'ttsfleet_inference_requests_in_flight{model="tiny"} 3.0' in text
    assert "ttsfleet_inference_ttfa_seconds_bucket" in text
    assert 'ttsfleet_gpus{gpu_class="h200",workload="fill"} 7.0' in text
    exposed = {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line and line[0] != "#"}
    assert exposed <= metrics.all_exposed_names() | {n + "_created" for n in
                                                     (m.name for m in metrics.CONTRACT_LIST)}


def test_no_metric_name_is_hard_coded_outside_the_contract():
    """Components must create metrics through the contract, never by literal name."""
    pattern = re.compile(r"(Counter|Gauge|Histogram|Summary|Info)\(\s*[\"']ttsfleet_")
    offenders = []
    for folder in ("ttsfleet", "operator", "inference", "kernels", "fill_jobs", "slurm"):
        for path in (ROOT / folder).rglob("*.py"):
            if path.name == "metrics.py" and path.parent.name == "ttsfleet":
                continue
            if pattern.search(path.read_text(errors="replace")):
                offenders.append(str(path.relative_to(ROOT)))
    assert offenders == []
