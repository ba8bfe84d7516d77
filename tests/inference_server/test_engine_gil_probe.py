"""The engine's GIL probe (``GilProbe`` in ``inference/engine_phases.py``,
``inference_engine_gil_wait_seconds``): microseconds when no other thread wants the interpreter, about
the switch interval when one holds it; a real engine exports it, and ``bench serve`` reads its mean."""

from __future__ import annotations

import sys
import threading

import pytest
from ttsfleet.inference.engine import Engine, EngineConfig
from ttsfleet.inference.engine_phases import GilProbe
from ttsfleet.inference.loader import load_model
from ttsfleet.inference.prompt import build_prompt
from ttsfleet.inference.tokenizer import load_tokenizer

from ttsfleet.metrics import make_collectors, spec

from .conftest import run_requests


def _probe(ticks: int) -> GilProbe:
    probe = GilProbe(every=1)
    for _ in range(ticks):
        probe.tick()
    return probe


@pytest.fixture
def switch_interval_10ms():
    before = sys.getswitchinterval()
    sys.setswitchinterval(0.01)
    yield 0.01
    sys.setswitchinterval(before)


def test_the_probe_sees_a_thread_that_holds_the_interpreter(switch_interval_10ms):
    free = _probe(20)
    stop = threading.Event()

    def spin() -> None:  # pure Python: lets go of the GIL only when the interval forces it
        n = 0
        while not stop.is_set():
            n += 1

    spinner = threading.Thread(target=spin, daemon=True)
    spinner.start()
    try:
        held = _probe(20)
    finally:
        stop.set()
        spinner.join()
    assert free.count == held.count == 20
    assert free.total_s / free.count < 0.002
    assert held.total_s / held.count > 0.4 * switch_interval_10ms  # ~ the whole interval each time


def test_it_probes_every_nth_tick_only():
    probe = GilProbe(every=4)
    for _ in range(10):
        probe.tick()
    assert probe.count == 2


def _gil_count(metrics) -> float:
    return metrics.registry.get_sample_value(spec("inference_engine_gil_wait_seconds").name + "_count",
                                             {"model": "tiny"}) or 0.0


def test_a_real_engine_exports_its_probes():
    model, tok = load_model("tiny"), load_tokenizer("tiny")
    prompt = build_prompt(tok, model.config, "GIL probe test.")
    metrics = make_collectors("inference")
    eng = Engine(model, None, EngineConfig(max_running_requests=2, max_queue=4), metrics, "tiny")
    eng._gil_probe.every = 1
    eng.start()
    try:
        assert run_requests(eng, prompt, 2, 6) == ["done"] * 2
    finally:
        eng.stop()
    assert _gil_count(metrics) == eng._gil_probe.count >= 6  # one per busy iteration, each step one


def test_bench_serve_reads_the_probes_mean():
    from prometheus_client.parser import text_string_to_metric_families
    from ttsfleet.inference.bench_engine_loop import engine_line, engine_totals, engine_use
    from ttsfleet.inference.bench_steady import Counts

    def exposition(gil_sum: float, gil_count: float, steps: float) -> list:
        lines = [f'ttsfleet_inference_engine_seconds_total{{model="tiny",phase="other"}} {steps / 100}',
                 f'ttsfleet_inference_engine_gil_wait_seconds_sum{{model="tiny"}} {gil_sum}',
                 f'ttsfleet_inference_engine_gil_wait_seconds_count{{model="tiny"}} {gil_count}',
                 f'ttsfleet_inference_batch_size_count{{model="tiny"}} {steps}',
                 f'ttsfleet_inference_batch_size_sum{{model="tiny"}} {steps * 64}']
        text = "# TYPE ttsfleet_inference_engine_gil_wait_seconds histogram\n" + "\n".join(lines) + "\n"
        return [s for fam in text_string_to_metric_families(text) for s in fam.samples]

    before, after = exposition(0.01, 10, 100), exposition(0.31, 110, 1_700)
    assert engine_totals(before)["gil:count"] == 10
    use = engine_use(Counts.between(before, after, 20.0).engine, 20.0)
    assert use["gil_wait_ms"] == pytest.approx(3.0) and use["gil_probes"] == 100
    assert use["step_ms"] == pytest.approx(10.0)  # the probe is not a phase of the step
    assert engine_line({"concurrency": 64, **use}, "steady window").endswith(
        "; the GIL back after letting go, mean 3.00 ms (100 probes)")
