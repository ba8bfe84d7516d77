"""The engine loop's time by phase (``inference/engine_phases.py``) on /metrics, and ``bench serve``'s
reading of it (``inference/bench_engine_loop.py``): a real tiny engine's counters add up to its own
timers, and two /metrics reads become steps a second and each step's interval by phase."""

from __future__ import annotations

import time
import types

import pytest
import torch
from prometheus_client.parser import text_string_to_metric_families
from ttsfleet.inference.bench import server_lines, server_report
from ttsfleet.inference.bench_engine_loop import engine_line, engine_totals, engine_use
from ttsfleet.inference.bench_steady import Counts, view_of
from ttsfleet.inference.codec import load_codec
from ttsfleet.inference.engine import Engine, EngineConfig
from ttsfleet.inference.engine_phases import ENGINE_PHASES, PhaseClock
from ttsfleet.inference.loader import load_model
from ttsfleet.inference.prompt import build_prompt
from ttsfleet.inference.tokenizer import load_tokenizer

from ttsfleet.metrics import make_collectors, spec

from .conftest import run_requests


def _phase_value(metrics, phase: str) -> float:
    return metrics.registry.get_sample_value(spec("inference_engine_seconds").exposed_names[0],
                                             {"model": "tiny", "phase": phase}) or 0.0


def test_an_iteration_is_split_into_its_timed_phases_and_the_rest():
    stats = types.SimpleNamespace(prefill_s=1.0, decode_s=2.0, wait_s=3.0, busy_s=0.0)
    metrics = make_collectors("inference")
    clock = PhaseClock(stats)
    clock.start()
    clock.stop()  # before export_to: counted in busy_s, exported nowhere (a warm-up is not traffic)
    assert all(_phase_value(metrics, p) == 0 for p in ENGINE_PHASES)
    clock.export_to({p: metrics["inference_engine_seconds"].labels("tiny", p) for p in ENGINE_PHASES})
    busy_before = stats.busy_s
    clock.start()
    stats.prefill_s += 0.004
    stats.decode_s += 0.002
    time.sleep(0.02)  # untimed work: it is "other"
    split = clock.stop()
    assert split["prefill"] == pytest.approx(0.004) and split["launch"] == pytest.approx(0.002)
    assert split["gpu_wait"] == 0 and split["other"] >= 0.02 - 0.006
    assert stats.busy_s - busy_before == pytest.approx(sum(split.values()))
    for phase in ("prefill", "launch", "other"):
        assert _phase_value(metrics, phase) == pytest.approx(split[phase])
    assert _phase_value(metrics, "gpu_wait") == 0  # nothing waited: no increment


def test_a_real_engines_phase_counters_add_up_to_its_timers():
    torch.set_num_threads(1)
    model, codec, tok = load_model("tiny"), load_codec("tiny"), load_tokenizer("tiny")
    prompt = build_prompt(tok, model.config, "Engine phase test.")
    metrics = make_collectors("inference")
    eng = Engine(model, codec, EngineConfig(max_running_requests=4, max_queue=8, cuda_graph_max_bs=4),
                 metrics, "tiny")
    eng.start()
    try:
        assert run_requests(eng, prompt, 6, 12, first_chunk_frames=1, chunk_frames=4) == ["done"] * 6
    finally:
        eng.stop()
    s = eng.stats
    assert _phase_value(metrics, "prefill") == pytest.approx(s.prefill_s) and s.prefill_s > 0
    assert _phase_value(metrics, "launch") == pytest.approx(s.decode_s) and s.decode_s > 0
    assert _phase_value(metrics, "gpu_wait") == pytest.approx(s.wait_s)
    assert _phase_value(metrics, "other") > 0
    total = sum(_phase_value(metrics, p) for p in ENGINE_PHASES)
    # the metrics are attached at construction: every busy iteration is counted; busy_s also holds
    # the idle iterations' few microseconds (a blocking read that timed out)
    assert total == pytest.approx(s.busy_s, rel=0.05) and total <= s.busy_s + 1e-9


def _samples(phases: dict[str, float], steps: float, rows: float) -> list:
    lines = [f'ttsfleet_inference_engine_seconds_total{{model="tiny",phase="{p}"}} {v}'
             for p, v in phases.items()]
    lines += [f'ttsfleet_inference_batch_size_count{{model="tiny"}} {steps}',
              f'ttsfleet_inference_batch_size_sum{{model="tiny"}} {rows}',
              'ttsfleet_inference_frames_total{model="tiny"} 999']
    return [s for fam in text_string_to_metric_families("\n".join(lines) + "\n") for s in fam.samples]


def test_two_reads_give_steps_a_second_and_each_steps_interval_by_phase():
    before = _samples({"gpu_wait": 1.0, "launch": 0.1, "prefill": 0.2, "other": 0.3}, steps=100, rows=6_000)
    after = _samples({"gpu_wait": 13.0, "launch": 1.1, "prefill": 2.7, "other": 3.3}, steps=1_100,
                     rows=70_000)
    assert engine_totals(before) == {"gpu_wait": 1.0, "launch": 0.1, "prefill": 0.2, "other": 0.3,
                                     "steps": 100, "rows": 6_000}
    counts = Counts.between(before, after, 20.0)
    use = engine_use(counts.engine, 20.0)
    assert use == {"steps_per_s": 50.0, "mean_batch": 64.0, "busy_share": pytest.approx(0.925),
                   "step_ms": pytest.approx(18.5),
                   "per_step_ms": {"gpu_wait": 12.0, "launch": 1.0, "prefill": 2.5, "other": 3.0}}
    assert view_of(counts).engine == use
    assert engine_line({"concurrency": 64, **use}, "steady window") == (
        "c=64 engine, steady window: 50.0 steps/s at batch 64.0, 18.5 ms a step: gpu_wait 12.0, "
        "launch 1.0, prefill 2.5, other 3.0 (busy 92%)")


def test_an_older_server_or_an_idle_span_gives_no_engine_line():
    """A server without the phase counter (its batch histogram alone) and a span without a step give
    no reading, no report entry and no line."""
    old = [s for s in _samples({"other": 1.0}, 10, 10) if "engine" not in s.name]
    assert engine_totals(old) == {}
    same = _samples({"other": 1.0}, 10, 10)
    assert engine_use(Counts.between(same, same, 5.0).engine, 5.0) == {}
    level = types.SimpleNamespace(level=types.SimpleNamespace(concurrency=8),
                                  whole=view_of(Counts.between(same, same, 5.0)), steady=None)
    report = server_report([level])
    assert report["engine"] == [] and report["engine_steady"] == []
    assert not [line for line in server_lines(report) if "engine," in line]
