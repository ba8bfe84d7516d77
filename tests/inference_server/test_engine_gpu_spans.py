"""The engine's GPU work timed in situ (``GpuSpans`` in ``inference/engine_phases.py``,
``inference_engine_gpu_seconds{work}``): spans are read only once done, in order, never twice, and a
real engine on a GPU exports its decode steps' and prefill calls' GPU time (skipped without CUDA)."""

from __future__ import annotations

import pytest
import torch
from ttsfleet.inference.engine import Engine, EngineConfig
from ttsfleet.inference.engine_phases import GPU_WORK, GpuSpans
from ttsfleet.inference.loader import load_model
from ttsfleet.inference.prompt import build_prompt
from ttsfleet.inference.tokenizer import load_tokenizer

from ttsfleet.metrics import make_collectors, spec

from .conftest import run_requests


class _Event:
    """Stands for a recorded CUDA event on a stream that is at ``now`` ms: done once reached."""

    def __init__(self, stream: list[float], at_ms: float) -> None:
        self.stream, self.at_ms = stream, at_ms

    def query(self) -> bool:
        return self.stream[0] >= self.at_ms

    def elapsed_time(self, end: _Event) -> float:
        assert self.query() and end.query(), "elapsed_time on an event not yet reached"
        return end.at_ms - self.at_ms


def _gpu_value(metrics, work: str) -> float:
    return metrics.registry.get_sample_value(spec("inference_engine_gpu_seconds").exposed_names[0],
                                             {"model": "tiny", "work": work}) or 0.0


def test_spans_are_read_once_done_and_exported_once():
    stream = [0.0]  # how far the stream has run, ms
    metrics = make_collectors("inference")
    spans = GpuSpans()
    spans.export_to({w: metrics["inference_engine_gpu_seconds"].labels("tiny", w) for w in GPU_WORK})
    spans.add("prefill", _Event(stream, 1.0), _Event(stream, 4.0))
    spans.add("decode", _Event(stream, 4.0), _Event(stream, 13.5))
    stream[0] = 5.0  # the prefill is done, the step is not
    spans.harvest()
    assert spans.seconds == {"decode": 0.0, "prefill": pytest.approx(0.003)}
    stream[0] = 20.0
    spans.harvest()
    spans.harvest()  # nothing left: no second count
    assert spans.seconds == {"decode": pytest.approx(0.0095), "prefill": pytest.approx(0.003)}
    assert _gpu_value(metrics, "decode") == pytest.approx(0.0095)
    assert _gpu_value(metrics, "prefill") == pytest.approx(0.003)


def test_unread_spans_are_bounded():
    stream = [0.0]
    spans = GpuSpans()
    for i in range(GpuSpans.MAX_PENDING + 10):
        spans.add("decode", _Event(stream, i), _Event(stream, i + 0.5))
    stream[0] = 1e9
    spans.harvest()
    # the 10 oldest were dropped unread; the rest counted 0.5 ms each
    assert spans.seconds["decode"] == pytest.approx(GpuSpans.MAX_PENDING * 0.0005)


def test_a_cpu_engine_times_no_gpu_work():
    model = load_model("tiny")
    metrics = make_collectors("inference")
    eng = Engine(model, None, EngineConfig(max_running_requests=2, max_queue=4), metrics, "tiny")
    assert eng._gpu_spans is None
    assert all(_gpu_value(metrics, w) == 0 for w in GPU_WORK)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("side_stream", [False, True], ids=["inline", "side-stream"])
def test_a_gpu_engine_exports_its_decode_and_prefill_gpu_time(side_stream: bool):
    model, tok = load_model("tiny", device="cuda"), load_tokenizer("tiny")
    prompt = build_prompt(tok, model.config, "GPU spans test.")
    metrics = make_collectors("inference")
    eng = Engine(model, None, EngineConfig(max_running_requests=4, max_queue=8, cuda_graph_max_bs=4,
                                           device="cuda", prefill_stream=side_stream), metrics, "tiny")
    eng.start()
    try:
        assert run_requests(eng, prompt, 6, 12, first_chunk_frames=1, chunk_frames=4) == ["done"] * 6
    finally:
        eng.stop()
    decode, prefill = _gpu_value(metrics, "decode"), _gpu_value(metrics, "prefill")
    assert decode > 0 and prefill > 0
    # counted only after the metrics were attached (at construction here), never more than the
    # engine's wall time busy: both together inline (one stream), each on its own beside the side
    # stream, where they overlap
    assert (max(decode, prefill) if side_stream else decode + prefill) <= eng.stats.busy_s + 1e-6
    assert decode == pytest.approx(eng._gpu_spans.seconds["decode"])


def _exposition(phases: dict[str, float], gpu: dict[str, float], steps: float, rows: float,
                tokens: float | None = None) -> list:
    from prometheus_client.parser import text_string_to_metric_families

    lines = [f'ttsfleet_inference_engine_seconds_total{{model="tiny",phase="{p}"}} {v}'
             for p, v in phases.items()]
    lines += [f'ttsfleet_inference_engine_gpu_seconds_total{{model="tiny",work="{w}"}} {v}'
              for w, v in gpu.items()]
    lines += [f'ttsfleet_inference_batch_size_count{{model="tiny"}} {steps}',
              f'ttsfleet_inference_batch_size_sum{{model="tiny"}} {rows}']
    if tokens is not None:
        lines.append(f'ttsfleet_inference_prefill_tokens_total{{model="tiny"}} {tokens}')
    return [s for fam in text_string_to_metric_families("\n".join(lines) + "\n") for s in fam.samples]


def test_bench_serve_gives_a_steps_gpu_work_beside_its_interval():
    from ttsfleet.inference.bench_engine_loop import engine_line, engine_totals, engine_use
    from ttsfleet.inference.bench_steady import Counts

    phases = {"gpu_wait": 1.0, "launch": 0.1, "prefill": 0.2, "other": 0.3}
    before = _exposition(phases, {"decode": 1.0, "prefill": 0.5}, steps=100, rows=6_400)
    after = _exposition({p: 10 * v for p, v in phases.items()}, {"decode": 13.0, "prefill": 2.5}, steps=1_100,
                        rows=70_400)
    assert engine_totals(before)["gpu:decode"] == 1.0 and engine_totals(before)["gpu:prefill"] == 0.5
    use = engine_use(Counts.between(before, after, 20.0).engine, 20.0)
    # the GPU work is not a phase of the loop's interval: the step stays the phases' sum
    assert use["step_ms"] == pytest.approx(1000 * 14.4 / 1000)
    assert use["gpu_ms"] == {"decode": 12.0, "prefill": 2.0}
    assert engine_line({"concurrency": 64, **use}, "steady window").endswith(
        "; its GPU work in situ, ms a step: decode 12.0, prefill 2.0")
    cpu_server = _exposition(phases, {}, steps=100, rows=6_400)
    assert not any(k.startswith("gpu:") for k in engine_totals(cpu_server))
    assert engine_totals(_exposition({}, {"decode": 1.0}, steps=1, rows=1)) == {}  # no phases: no reading


def test_bench_serve_gives_the_prefills_tokens_a_step_and_its_span_per_thousand():
    """With the prompt tokens counted, the line says how many a step and what the prefill's GPU span
    costs per 1,000 of them (in situ, whatever the prompts' length); a CPU server: the tokens alone."""
    from ttsfleet.inference.bench_engine_loop import engine_line, engine_use
    from ttsfleet.inference.bench_steady import Counts

    phases = {"gpu_wait": 1.0, "launch": 0.1, "prefill": 0.2, "other": 0.3}
    before = _exposition(phases, {"decode": 1.0, "prefill": 0.5}, steps=100, rows=6_400, tokens=10_000)
    after = _exposition({p: 10 * v for p, v in phases.items()}, {"decode": 13.0, "prefill": 2.5}, steps=1_100,
                        rows=70_400, tokens=210_000)
    use = engine_use(Counts.between(before, after, 20.0).engine, 20.0)
    assert use["prefill_tokens_per_step"] == 200.0  # 200,000 tokens over 1,000 steps
    assert use["prefill_gpu_ms_per_1k_tokens"] == 10.0  # 2.0 s of span over 200,000 tokens
    assert engine_line({"concurrency": 64, **use}, "steady window").endswith(
        "prefill 2.0; prefill 200 tokens a step, its span 10.0 ms per 1,000")
    first, second = _exposition(phases, {}, 100, 6_400, 0), _exposition(phases, {}, 200, 12_800, 5_000)
    cpu = engine_use(Counts.between(first, second, 10.0).engine, 10.0)
    assert cpu["prefill_tokens_per_step"] == 50.0 and "prefill_gpu_ms_per_1k_tokens" not in cpu
