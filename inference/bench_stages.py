"""Tail quantiles of the server's time to first audio by stage, from its Prometheus histograms.

Why: ``bench serve`` already reports each stage's mean (``ttfa_stages_ms``), but the serving target
is a p99 (first audio p99 <= 250 ms at c=64) and the H200 runs of 2026-12-04 missed it with every
stage's mean small (c=64: p99 300 ms, stage means 0-37 ms). Which stage holds the tail is what the
next change needs to know. The server already counts every request's stages in
``inference_ttfa_stage_seconds`` (a histogram): the difference of two /metrics reads gives the
level's requests per bucket, and the quantile is read from it as Prometheus's
``histogram_quantile`` does (linear within the bucket that holds it), so a dashboard and the bench
read the same figure. Bucket edges bound the precision: 25 ms up to 150 ms (``LATENCY_BUCKETS``).
Stage quantiles do not add up to the time to first audio's: a request slow in one stage need not
be slow in another.
"""

from __future__ import annotations

from typing import Any

StageBuckets = dict[str, dict[float, float]]  # {stage: {upper bound s: cumulative requests}}


#: The key under which :func:`stage_buckets` gives the server's whole time to first audio
#: (``inference_ttfa_seconds``) beside its stages: the tail the server itself sees, to hold against the
#: client's (what lies between is the network, the HTTP path after the first chunk left the handler,
#: and the client's own lateness, :mod:`.loop_lag`).
TOTAL = "total"


def stage_buckets(samples: list[Any]) -> StageBuckets:
    """The cumulative bucket counts of ``inference_ttfa_stage_seconds`` in one /metrics read, per
    stage, summed over the other labels (every model the server runs), and of
    ``inference_ttfa_seconds`` under :data:`TOTAL`."""
    from ttsfleet.metrics import spec

    names = {spec("inference_ttfa_stage_seconds").name + "_bucket": None,
             spec("inference_ttfa_seconds").name + "_bucket": TOTAL}
    out: StageBuckets = {}
    for smp in samples:
        if smp.name in names:
            le = float(smp.labels["le"])
            per = out.setdefault(names[smp.name] or smp.labels.get("stage", "?"), {})
            per[le] = per.get(le, 0.0) + smp.value
    return out


def stage_quantiles_ms(grown: StageBuckets, q: float) -> dict[str, float]:
    """Per stage, the ``q`` quantile in ms of the requests observed in a span, from how much the
    cumulative buckets of :func:`stage_buckets` grew in it (:meth:`.bench_steady.Counts.between`)
    (:func:`ttsfleet.metrics.histogram_quantile`)."""
    from ttsfleet.metrics import histogram_quantile

    out = {}
    for stage, cum in grown.items():
        value = histogram_quantile(q, sorted(cum.items()))
        if value is not None:
            out[stage] = round(1000 * value, 1)
    return out
