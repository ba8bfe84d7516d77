"""The stage quantiles ``bench serve`` reads from the server's histograms (Prometheus semantics)."""

from __future__ import annotations

import math

import pytest
from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from ttsfleet.inference.bench_stages import stage_buckets, stage_quantiles_ms
from ttsfleet.inference.bench_steady import Counts

from ttsfleet.metrics import LATENCY_BUCKETS, histogram_quantile, spec


def test_quantile_is_linear_within_the_bucket_that_holds_the_rank():
    cum = [(0.1, 0.0), (0.2, 50.0), (0.3, 100.0), (math.inf, 100.0)]
    assert histogram_quantile(0.5, cum) == pytest.approx(0.2)
    assert histogram_quantile(0.99, cum) == pytest.approx(0.298)
    assert histogram_quantile(0.25, cum) == pytest.approx(0.15)
    # the first bucket interpolates from 0; a rank past the last finite bound reads that bound
    assert histogram_quantile(0.5, [(0.1, 10.0), (math.inf, 10.0)]) == pytest.approx(0.05)
    assert histogram_quantile(0.99, [(0.1, 10.0), (math.inf, 100.0)]) == pytest.approx(0.1)
    assert histogram_quantile(0.99, [(0.1, 0.0), (math.inf, 0.0)]) is None


def _samples(registry: CollectorRegistry) -> list:
    text = generate_latest(registry).decode()
    return [s for fam in text_string_to_metric_families(text) for s in fam.samples]


def test_stage_p99_of_a_level_is_the_difference_of_two_reads():
    """A real prometheus_client histogram with the server's metric name, labels and buckets: the
    level's p99 counts only what was observed between the reads."""
    reg = CollectorRegistry()
    m = spec("inference_ttfa_stage_seconds")
    h = Histogram(m.name, "stages", ["model", "stage"], buckets=LATENCY_BUCKETS, registry=reg)
    for _ in range(100):  # before the level: slow queueing that must not count
        h.labels("tiny", "queue").observe(2.5)
    before = _samples(reg)
    assert stage_buckets(before)["queue"][math.inf] == 100
    for i in range(100):
        h.labels("tiny", "queue").observe(0.010 if i < 98 else 0.45)  # two slow ones in the level
        h.labels("tiny", "prefill").observe(0.030)
    after = _samples(reg)
    p99 = stage_quantiles_ms(Counts.between(before, after, 1.0).buckets, 0.99)
    assert set(p99) == {"queue", "prefill"}
    assert 400 < p99["queue"] <= 500  # the 0.4-0.5 s bucket, not the 2.5 s of before the level
    assert 25 < p99["prefill"] <= 50
    assert stage_quantiles_ms(Counts.between(after, after, 1.0).buckets, 0.99) == {}  # nothing in between


def test_the_servers_whole_first_audio_is_read_beside_its_stages():
    """``inference_ttfa_seconds`` (the server's arrival to first chunk sent) under ``total``: the tail
    the server sees, to hold against the client's."""
    reg = CollectorRegistry()
    stages = Histogram(spec("inference_ttfa_stage_seconds").name, "stages", ["model", "stage"],
                       buckets=LATENCY_BUCKETS, registry=reg)
    total = Histogram(spec("inference_ttfa_seconds").name, "total", ["model"], buckets=LATENCY_BUCKETS,
                      registry=reg)
    before = _samples(reg)
    for i in range(100):
        stages.labels("tiny", "decode").observe(0.04)
        total.labels("tiny").observe(0.09 if i < 98 else 0.7)
    p99 = stage_quantiles_ms(Counts.between(before, _samples(reg), 1.0).buckets, 0.99)
    assert set(p99) == {"decode", "total"}
    assert 500 < p99["total"] <= 750 and p99["decode"] <= 50
