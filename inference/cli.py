"""``ttsfleet serve`` and ``ttsfleet bench serve``.

Flags override the ``TTSFLEET_*`` environment the operator sets (see
:mod:`ttsfleet.contracts.serving`); heavy imports (torch, fastapi) stay inside the commands.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import typer

from ttsfleet.contracts import serving
from ttsfleet.errors import UserError
from ttsfleet.quantization import choices_text


def print_table(report: dict) -> None:
    from ttsfleet.inference.bench import print_table as show

    show(report)


_CODEC_COMPILE_CHOICES = " | ".join(("off", *serving.CODEC_COMPILE_MODES))

bench_app = typer.Typer(help="Load generators and benchmarks against running services.", no_args_is_help=True)


def serve(
    host: str = typer.Option(None, help="Bind address (env TTSFLEET_HOST, default 127.0.0.1: loopback only; "
                             "0.0.0.0 to serve other machines, as a pod does)."),
    port: int = typer.Option(None, help=f"Port (env {serving.PORT}, default {serving.INFERENCE_PORT})."),
    checkpoint: str = typer.Option(None, help="Checkpoint directory, or 'tiny' (deterministic random "
                                   "weights, noise-like audio, CPU) (env TTSFLEET_CHECKPOINT)."),
    model_name: str = typer.Option(None, help="Model label in metrics (env TTSFLEET_MODEL_NAME)."),
    gpu_class: str = typer.Option(None, help="GPU class from the catalog (h200, rtx5090, ...) "
                                  "(env TTSFLEET_GPU_CLASS)."),
    quantization: str = typer.Option(None, help=f"{choices_text()} (env TTSFLEET_QUANTIZATION; "
                                     "auto = the GPU class's scheme)."),
    max_running_requests: int = typer.Option(None, help="Decode slots (env TTSFLEET_MAX_RUNNING_REQUESTS)."),
    max_queue: int = typer.Option(None, help="Waiting requests before 429 (env TTSFLEET_MAX_QUEUE)."),
    cuda_graph_max_bs: int = typer.Option(None, help="Largest captured decode batch; default "
                                          "max_running_requests, every admitted batch "
                                          "(env TTSFLEET_CUDA_GRAPH_MAX_BS)."),
    device: str = typer.Option(None, help="auto | cpu | cuda[:N] (env TTSFLEET_DEVICE)."),
    api_key: list[str] = typer.Option(None, help="Accepted Bearer key (repeatable) (env TTSFLEET_API_KEYS, "
                                      "comma-separated); none = no key needed."),
    references_dir: str = typer.Option(None, help="Where reference voices persist "
                                       "(env TTSFLEET_REFERENCES_DIR)."),
    max_text_chars: int = typer.Option(None, help="Longest accepted text (env TTSFLEET_MAX_TEXT_CHARS, "
                                       "default 4096 as OpenAI)."),
    max_new_tokens: int = typer.Option(None, help="Cap on frames per segment (env TTSFLEET_MAX_NEW_TOKENS)."),
    drain_grace_s: float = typer.Option(None, help="After SIGTERM, keep answering 503 at least this long "
                                        "(env TTSFLEET_DRAIN_GRACE_S)."),
    drain_timeout_s: float = typer.Option(None, help="After SIGTERM, exit after this long even if busy "
                                          "(env TTSFLEET_DRAIN_TIMEOUT_S)."),
    body_timeout_s: float = typer.Option(None, help="Longest wait for a request body or a live session's "
                                         "start event, then 408; 0 = no limit (env TTSFLEET_BODY_TIMEOUT_S, "
                                         "default 30)."),
    seed: int = typer.Option(None, help="Weight seed of the tiny model (env TTSFLEET_SEED)."),
    prefill_chunk_tokens: int = typer.Option(None, help="Longest prompt piece prefilled between two decode "
                                             "steps; longer prompts are prefilled in chunks, 0 = whole "
                                             "prompts (env TTSFLEET_PREFILL_CHUNK_TOKENS, default 256)."),
    prefill_coalesce_ms: float = typer.Option(None, help="Longest wait of a new prompt, while a batch "
                                              "decodes, for others to share its prefill call; 0 = off (env "
                                              "TTSFLEET_PREFILL_COALESCE_MS, default 0)."),
    codec_gather_ms: float = typer.Option(None, help="Longest wait of a chunk of codes for other streams to "
                                          "share its codec push (first audio and streams about to run dry "
                                          "go at once, alone); 0 = off (env TTSFLEET_CODEC_GATHER_MS; "
                                          "default: the GPU class's catalog value on its GPU, 0 for every "
                                          "class today)."),
    codec_layout: str = typer.Option(None, metavar="LAYOUT", help="ncl | channels-last: the codec "
                                     "decoder's convolutions (channels-last: cuDNN's NHWC kernels, 1.15x "
                                     "faster pushes on an H200; env TTSFLEET_CODEC_LAYOUT, default: the GPU "
                                     "class's, channels-last on an H200, else ncl)."),
    preset_text: str = typer.Option(None, metavar="TEXT", help="bytes | qwen-bpe: how a random-weight "
                                    "preset (s2-pro, ...) tokenizes text; qwen-bpe: S2 Pro's own text "
                                    "vocabulary, prompts of the real model's length (needs pip install "
                                    "--no-deps dashscope for Qwen's ranks; env TTSFLEET_PRESET_TEXT, "
                                    "default bytes)."),
    catalog: str = typer.Option(None, help="GPU catalog file merged over the built-in classes: a class "
                                "it adds gets its scheme, limits and kernels (env TTSFLEET_CATALOG)."),
    codec_fast: bool = typer.Option(None, "--codec-fast/--no-codec-fast", help="CUDA: bf16 codec, fused "
                                    "Snake kernel, graphs for every stream bucket; --no-codec-fast: "
                                    "float32, eager (env TTSFLEET_CODEC_FAST, default on)."),
    codec_compile: str = typer.Option(None, metavar="MODE", help=f"{_CODEC_COMPILE_CHOICES}: the batched "
                                      "codec decode through torch.compile (Inductor fuses its "
                                      "elementwise passes), compiled at start before the codec graphs are "
                                      "captured; a failed compile decodes eagerly. Off by default: not yet "
                                      "measured on a GPU (env TTSFLEET_CODEC_COMPILE, default off)."),
    prefill_graphs: bool = typer.Option(None, "--prefill-graphs/--no-prefill-graphs", help="CUDA: the "
                                        "prefill's per-row work (all but attention) from CUDA graphs, one "
                                        "set per row bucket (env TTSFLEET_PREFILL_GRAPHS, default on)."),
    gil_switch_ms: float = typer.Option(None, help="The interpreter's thread switch interval in ms; 0 = "
                                        "Python's own 5 ms (env TTSFLEET_GIL_SWITCH_MS)."),
    gc_freeze: bool = typer.Option(None, "--gc-freeze/--no-gc-freeze", help="After the warm-up, one full "
                                   "garbage collection and gc.freeze(): later collections skip start-up's "
                                   "objects (torch, the model), whose full passes stop every thread of the "
                                   "server for tens of ms (env TTSFLEET_GC_FREEZE, default on)."),
    prefix_reuse: bool = typer.Option(None, "--prefix-reuse/--no-prefix-reuse", help="Prefill a cloned "
                                      "voice's prompt head once and reuse it: at a live session's open "
                                      "(real-time mode) and across a long text's segments (env "
                                      "TTSFLEET_PREFIX_REUSE, default on)."),
    prefix_job_wait_ms: float = typer.Option(None, help="Longest a live session's voice-head prefill, while "
                                             "no text waits for it, lets requests whose first audio is "
                                             "awaited go first; 0 = plain FIFO (env "
                                             "TTSFLEET_PREFIX_JOB_WAIT_MS, default 1000)."),
    codec_process: bool = typer.Option(None, "--codec-process/--no-codec-process", help="Decode audio in a "
                                       "child process with its own copy of the codec, off the engine's "
                                       "interpreter (env TTSFLEET_CODEC_PROCESS; default: the GPU class's "
                                       "catalog entry on a GPU, on for the H200, else off)."),
    mps: str = typer.Option(None, help="auto | on | off: run the codec process under CUDA's MPS (the "
                            "node's daemon, else one started here; without it the two processes "
                            "time-slice the GPU) (env TTSFLEET_MPS, default auto)."),
    log_level: str = typer.Option("info", help="debug | info | warning | error."),
) -> None:
    """Serve text-to-speech (Fish Audio /v1/tts and /v1/tts/live, OpenAI /v1/audio/speech, /metrics)."""
    from ttsfleet.inference.server import ServeConfig, run

    if log_level not in ("debug", "info", "warning", "error"):
        raise UserError(f"log level {log_level!r} is not debug, info, warning or error")
    cfg = ServeConfig.from_env(
        host=host, port=port, checkpoint=checkpoint, model_name=model_name, gpu_class=gpu_class,
        quantization=quantization, max_running_requests=max_running_requests, max_queue=max_queue,
        cuda_graph_max_bs=cuda_graph_max_bs,
        device=device, api_keys=tuple(api_key) if api_key else None, references_dir=references_dir,
        max_text_chars=max_text_chars, max_new_tokens=max_new_tokens, drain_grace_s=drain_grace_s,
        drain_timeout_s=drain_timeout_s, body_timeout_s=body_timeout_s, seed=seed,
        prefill_chunk_tokens=prefill_chunk_tokens, prefill_coalesce_ms=prefill_coalesce_ms, catalog=catalog,
        codec_gather_ms=codec_gather_ms, codec_layout=codec_layout, preset_text=preset_text,
        codec_fast=codec_fast, codec_compile=codec_compile, prefill_graphs=prefill_graphs,
        gil_switch_ms=gil_switch_ms, gc_freeze=gc_freeze, prefix_reuse=prefix_reuse,
        prefix_job_wait_ms=prefix_job_wait_ms, codec_process=codec_process, mps=mps)
    code = run(cfg, log_level=log_level)
    if code:
        raise typer.Exit(code)


@bench_app.command("serve")
def bench_serve(
    url: str = typer.Option(f"http://127.0.0.1:{serving.INFERENCE_PORT}",
                            help="Base URL of a running server."),
    concurrency: str = typer.Option("1,4,16,64", help="Comma-separated concurrency levels."),
    requests: int = typer.Option(0, help="Requests per level (0 = --per-client x concurrency, at least 4)."),
    per_client: int = typer.Option(10, help="Closed-loop requests per client (>= 3: a steady window)."),
    rate: str = typer.Option("", help="Open-loop levels after the closed ones: comma-separated Poisson "
                             "arrival rates, requests/s (--concurrency '' for open loop only)."),
    duration_s: float = typer.Option(30.0, help="Length of each open-loop level, seconds."),
    text: str = typer.Option("The quick brown fox jumps over the lazy dog.", help="Text of every request."),
    max_new_tokens: int = typer.Option(128, help="Frames per request at most."),
    fmt: str = typer.Option("pcm", "--format", help="Response format (pcm is cheapest to encode)."),
    api_key: str = typer.Option(None, help="Bearer key if the server requires one."),
    out: Path = typer.Option(None, help="Directory for bench.json and bench.png."),
    timeout_s: float = typer.Option(300.0, help="Per-request timeout."),
    seed: int = typer.Option(1, help="Base sampling seed (request i uses seed + i)."),
    repeats: int = typer.Option(1, help="Runs per level: median frames/s and its spread (the gate needs 3)."),
    frames_spread: float = typer.Option(0.0, help="Request i asks for max_new_tokens x (1 +- this), seeded."),
    connections: str = typer.Option("own", help="own: each listener its own connection; shared: one pooled "
                                    "client for all (whose pool delays requests; for side-by-side runs)."),
) -> None:
    """Drive a running server at several concurrencies; report frames/s and time to first audio."""
    from ttsfleet.inference.bench import BenchConfig, run_bench, write_outputs
    from ttsfleet.inference.bench_clients import CONNECTION_MODES

    rates = _rates(rate)
    levels = _levels(concurrency) if concurrency.strip() or not rates else []
    if fmt not in ("wav", "pcm", "mp3", "opus"):
        raise UserError(f"--format {fmt!r} is not wav, pcm, mp3 or opus")
    if max_new_tokens < 1 or requests < 0 or repeats < 1 or not 0 <= frames_spread < 1:
        raise UserError("--max-new-tokens, --repeats >= 1, --requests >= 0, --frames-spread in [0, 1) please")
    if per_client < 1 or duration_s <= 0:
        raise UserError("--per-client must be >= 1 and --duration-s > 0")
    if connections not in CONNECTION_MODES:
        raise UserError(f"--connections {connections!r} is not {' or '.join(CONNECTION_MODES)}")
    cfg = BenchConfig(url=url.rstrip("/"), levels=levels, requests=requests, text=text,
                      max_new_tokens=max_new_tokens, fmt=fmt, api_key=api_key, timeout_s=timeout_s, seed=seed,
                      repeats=repeats, frames_spread=frames_spread, per_client=per_client, rates=rates,
                      open_duration_s=duration_s, connections=connections)
    result = run_bench(cfg)
    print_table(result)
    if out is not None:
        from ttsfleet.inference.bench_engine import write_csv

        paths = [*write_outputs(result, out), write_csv(result, out)]
        typer.echo("wrote " + ", ".join(str(p) for p in paths))


def _rates(rate: str) -> list[float]:
    try:
        rates = [float(x) for x in rate.split(",") if x.strip()]
    except ValueError:
        raise UserError(f"--rate {rate!r} must be comma-separated numbers (requests/s)") from None
    if any(not r > 0 for r in rates):  # also NaN
        raise UserError("--rate levels must be > 0 requests/s")
    return rates


def _levels(concurrency: str) -> list[int]:
    try:
        levels = sorted({int(x) for x in concurrency.split(",") if x.strip()})
    except ValueError:
        raise UserError(f"--concurrency {concurrency!r} must be comma-separated integers") from None
    if not levels or levels[0] < 1:
        raise UserError("--concurrency needs at least one level >= 1")
    return levels


@bench_app.command("engine")
def bench_engine(
    checkpoint: str = typer.Option("s2-pro", help="Model preset (random weights) or checkpoint directory."),
    codec: str = typer.Option("s2-pro", help="Codec preset / codec.pth, or 'none' for a codes-only engine."),
    device: str = typer.Option("cuda", help="torch device."),
    quantize: str = typer.Option("auto", help="none | bsgemm_fp8 | mxfp8 | auto."),
    concurrency: str = typer.Option("1,2,4,8,16,32,64", help="Comma-separated concurrency levels."),
    prompt_tokens: int = typer.Option(512, help="Prompt length of every request."),
    frames: int = typer.Option(128, help="Frames every request decodes (end-of-speech ignored)."),
    requests: int = typer.Option(0, help="Requests per level (0 = --per-client x concurrency, at least 4)."),
    per_client: int = typer.Option(10, help="Closed-loop requests per client (>= 3: a steady window)."),
    prefill_chunk_tokens: int = typer.Option(0, help="Prefill chunk size in tokens (0 = whole prompts)."),
    prefill_token_budget: int = typer.Option(2048, help="Prompt tokens per engine step (one call)."),
    breakdown: bool = typer.Option(True, help="Also time the decode step and its parts per batch size."),
    repeats: int = typer.Option(1, help="Runs per level: median frames/s and its spread (the gate needs 3)."),
    pipeline_depth: int = typer.Option(1, help="Decode steps in flight before reading frames (0 = sync)."),
    plant_slowdown: float = typer.Option(0.0, help="Gate test hook: slow each decode step by this fraction."),
    frames_spread: float = typer.Option(0.0, help="Request lengths vary by +- this fraction of --frames."),
    gate: bool = typer.Option(False, help="Then each level unchanged and with a planted 10% slowdown, "
                              "run by run in turn: the re-run gated on pass 1, the planted runs on the "
                              "unchanged ones beside them."),
    codec_fast: bool = typer.Option(True, "--codec-fast/--no-codec-fast", help="CUDA: the codec in its "
                                    "fast mode (bf16, fused Snake, graphs), as serve runs it."),
    prefill_graphs: bool = typer.Option(True, "--prefill-graphs/--no-prefill-graphs", help="CUDA: the "
                                        "prefill's per-row work from CUDA graphs, as serve runs it."),
    codec_compile: str = typer.Option("off", metavar="MODE", help=f"{_CODEC_COMPILE_CHOICES}: the batched "
                                      "codec decode through torch.compile (as serve --codec-compile)."),
    codec_process: bool = typer.Option(False, "--codec-process/--no-codec-process", help="Decode audio in "
                                       "a child process (as serve --codec-process)."),
    mps: str = typer.Option("auto", help="auto | on | off: the codec process under CUDA's MPS (as serve "
                            "--mps)."),
    gil_switch_ms: float = typer.Option(0.0, help="The interpreter's thread switch interval in ms for the "
                                        "run (as serve --gil-switch-ms); 0 = Python's own 5 ms."),
    out: Path = typer.Option(None, help="Directory for bench.json, bench.csv and bench.png."),
) -> None:
    """The decode engine in process under closed-loop load: frames/s, TTFA, step breakdown."""
    from ttsfleet.inference.bench import write_outputs
    from ttsfleet.inference.bench_engine import (
        EngineBenchConfig,
        phase_line,
        print_breakdown,
        run_engine_bench,
        write_csv,
    )
    from ttsfleet.inference.mps import check_mode as check_mps_mode
    from ttsfleet.inference.mps import serving_under_mps

    levels = _levels(concurrency)
    if min(prompt_tokens, frames, repeats, prefill_token_budget) < 1 or min(requests, prefill_chunk_tokens,
                                                                            pipeline_depth) < 0:
        raise UserError("--prompt-tokens, --frames, --repeats, --prefill-token-budget must be >= 1; "
                        "--requests, --prefill-chunk-tokens, --pipeline-depth >= 0")
    if not 0 <= plant_slowdown < 0.9 or not 0 <= frames_spread < 1:
        raise UserError("--plant-slowdown must be in [0, 0.9) and --frames-spread in [0, 1)")
    if codec_compile not in ("off", *serving.CODEC_COMPILE_MODES):
        raise UserError(f"--codec-compile {codec_compile!r} is not one of {_CODEC_COMPILE_CHOICES}")
    mps = check_mps_mode(mps, "--mps")
    if gil_switch_ms < 0:
        raise UserError("--gil-switch-ms must be >= 0")
    if gil_switch_ms > 0:  # process-wide, like serve's: the engine, codec and client threads share one GIL
        sys.setswitchinterval(gil_switch_ms / 1000)
    cfg = EngineBenchConfig(checkpoint=checkpoint, codec=codec, device=device, quantize=quantize,
                            levels=levels, prompt_tokens=prompt_tokens, frames=frames, requests=requests,
                            max_running_requests=max(64, levels[-1]), breakdown=breakdown,
                            prefill_chunk_tokens=prefill_chunk_tokens,
                            prefill_token_budget=prefill_token_budget, repeats=repeats,
                            pipeline_depth=pipeline_depth, plant_slowdown=plant_slowdown,
                            frames_spread=frames_spread, gate=gate, codec_fast=codec_fast,
                            prefill_graphs=prefill_graphs,
                            codec_compile=None if codec_compile == "off" else codec_compile,
                            per_client=per_client, codec_process=codec_process)

    def progress(lv: Any) -> None:
        typer.echo(f"c={lv.concurrency}: {lv.frames_per_s:.0f} frames/s, "
                   f"TTFA p50 {lv.ttfa_p50_s * 1000:.0f} ms", err=True)

    with serving_under_mps(mps, codec_process, device):
        result = run_engine_bench(cfg, progress=progress)
    print_table(result)
    print_breakdown(result)
    for ph in result.get("engine_phases", []):
        typer.echo(phase_line(ph))
    for row in result.get("prefill", []):
        typer.echo(f"prefill {row['prompts']} x {prompt_tokens} tokens: {row['ms']:.1f} ms "
                   f"({row['tokens_per_s']:.0f} tokens/s)")
    if result.get("gate"):
        for name, against in (("rerun", "pass 1"), ("planted", "the unchanged runs beside it"),
                              ("planted_vs_first", "pass 1")):
            found = result["gate"][f"{name}_regressions"]
            typer.echo(f"gate {name} (against {against}): " + ("; ".join(found) if found else "pass"))
        for line in result["gate"].get("noisy", []):
            typer.echo(f"gate NOISY {line.replace('baseline', 'unchanged')}: the verdicts there are noise")
    if out is not None:
        paths = [*write_outputs(result, out), write_csv(result, out)]
        typer.echo("wrote " + ", ".join(str(p) for p in paths))


@bench_app.command("check")
def bench_check(
    baseline: Path = typer.Argument(..., help="Frozen baseline bench.json."),
    result: Path = typer.Argument(..., help="A new bench.json."),
    tolerance: float = typer.Option(None, help="Allowed drop below the baseline (0.05 = 5%); default: "
                                    "each level's measured run-to-run spread in the baseline (>= 3%)."),
) -> None:
    """Performance gate: exit 1 when frames/s at any baseline concurrency drops beyond the tolerance."""
    import json

    from ttsfleet.inference.bench_engine import noisy_levels, regressions

    reports = []
    for path in (baseline, result):
        try:
            reports.append(json.loads(path.read_text()))
        except (OSError, json.JSONDecodeError) as exc:
            raise UserError(f"cannot read bench report {path}: {exc}") from None
    try:
        found = regressions(*reports, tolerance=tolerance)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    if tolerance is None:
        for line in noisy_levels(reports[0]):
            typer.echo(f"NOISY {line}: gated at the cap; re-record it with more requests per level", err=True)
    for line in found:
        typer.echo(f"REGRESSION {line}")
    if found:
        raise typer.Exit(1)
    within = f"{tolerance:.0%}" if tolerance is not None else "its measured spread"
    typer.echo(f"ok: every baseline concurrency within {within} of {baseline}")


def register(root: typer.Typer) -> None:
    """Add this component's commands to the root CLI."""
    root.command("serve")(serve)
    root.add_typer(bench_app, name="bench", help="Load generators and benchmarks.")
