"""``ServeConfig``: what ``ttsfleet serve`` runs with — defaults < ``TTSFLEET_*`` environment < CLI flags.

The operator configures replicas through the environment; the names are the serving env contract
(:mod:`ttsfleet.contracts.serving`), imported by both sides, and the quantization names are
:mod:`ttsfleet.quantization`'s. Safe defaults: the server binds 127.0.0.1 unless
told otherwise (``--host 0.0.0.0`` / ``TTSFLEET_HOST=0.0.0.0`` in a pod) and needs no key unless
``TTSFLEET_API_KEYS`` / ``--api-key`` sets some.
"""

from __future__ import annotations

import importlib
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ttsfleet.inference.mps import check_mode as check_mps_mode

from ttsfleet.contracts.serving import (
    CODEC_COMPILE_MODES,
    CODEC_LAYOUTS,
    DEFAULT_QUEUE_PER_SLOT,
    INFERENCE_PORT,
    PRESET_TEXTS,
    SERVER_ENV,
    read_server_env,
)
from ttsfleet.errors import UserError
from ttsfleet.quantization import AUTO, parse_quantization

if TYPE_CHECKING:
    from ttsfleet.catalog import GpuCatalog

#: ``ServeConfig`` field -> the ``TTSFLEET_*`` variable the operator sets (the serving env contract).
ENV = SERVER_ENV


@dataclass
class ServeConfig:
    """Serving configuration: defaults < environment (``TTSFLEET_*``) < CLI flags."""

    host: str = "127.0.0.1"  # loopback unless told: a pod passes TTSFLEET_HOST=0.0.0.0
    port: int = INFERENCE_PORT
    checkpoint: str = "tiny"  # a directory, or a random-weight preset ("tiny": small, noise-like audio)
    model_name: str = ""
    gpu_class: str = ""
    quantization: str = AUTO  # a scheme of ttsfleet.quantization, or auto (the GPU class's)
    max_running_requests: int = 0  # 0 = the GPU class default (or 16 on CPU)
    max_queue: int = 0  # 0 = DEFAULT_QUEUE_PER_SLOT (4) x max_running_requests
    device: str = "auto"
    api_keys: tuple[str, ...] = ()
    references_dir: str = ""
    max_text_chars: int = 4096  # OpenAI's limit for /v1/audio/speech input
    max_new_tokens: int = 2048
    max_body_bytes: int = 32 * 1024 * 1024
    drain_grace_s: float = 0.0
    drain_timeout_s: float = 600.0
    #: Longest wait for a request body (or a live session's ``start`` event) to arrive: 408 after it
    #: (0 = no limit). A body still arriving is not load: a drain does not wait for it.
    body_timeout_s: float = 30.0
    seed: int = 0
    cpu_threads: int = 1  # torch threads when serving on CPU (1 avoids OpenMP oversubscription)
    cuda_graph_max_bs: int = 0  # 0 = ttsfleet.catalog.cuda_graph_max_bs(max_running_requests)
    cuda_graphs: bool = True  # capture decode graphs when serving on CUDA
    prefill_chunk_tokens: int = 256  # prompt tokens per prefill chunk (0 = whole prompts, no chunking)
    #: Longest hold of a new prompt so later arrivals share its prefill call (0 = off).
    prefill_coalesce_ms: float = 0.0
    #: Longest wait of a chunk of codes for other streams to share its codec push (0 = off):
    #: ``ttsfleet.inference.codec_gather``; None: the GPU class's catalog default on its GPU
    #: (``ServingDefaults.codec_gather_ms``), 0 on the CPU and without a class.
    codec_gather_ms: float | None = None
    #: The codec decoder's layout, ``ncl`` or ``channels-last``; empty: the GPU class's catalog default
    #: on its GPU (``ServingDefaults.codec_layout``: channels-last on an H200, measured +6 % served
    #: frames/s side by side), NCL on the CPU and without a class.
    codec_layout: str = ""
    #: A random-weight preset's text tokenizer: ``bytes`` (one token per byte) or ``qwen-bpe`` (Qwen's
    #: BPE, S2 Pro's own text vocabulary: a benchmark's prompts at the real model's length, ~4x fewer
    #: tokens; ``inference.tokenizer.QwenTextTokenizer``). A checkpoint directory's own tokenizer
    #: ignores it.
    preset_text: str = "bytes"
    #: bf16 codec + fused Snake kernel + CUDA graphs for every stream-count bucket (CUDA only; CPU
    #: serving keeps float32). On since the side-by-side H200 run of 2026-12-02
    #: (benchmarks/inference_h200/2026-12-02-ab: 3.4x the frames/s at c=64, first audio p99 9.0 ->
    #: 0.5 s); its cost, bf16 against float32: 19.7 dB SNR on random weights.
    codec_fast: bool = True
    #: ``off``, or the ``torch.compile`` mode of the batched codec decode (``default`` |
    #: ``max-autotune-no-cudagraphs``), compiled at start before the codec graphs are captured (issue
    #: #25). Off, measured served: on an H100 (2026-12-06b) the push 1.13-1.38x faster than the fused
    #: units' graphs, but served with a warm kernel cache (2026-12-06c, call10-h100-served-codec-compile-
    #: warm) frames/s -5.0 % at c=64 and -9.0 % at c=128 beside them (the codec busy 82 -> 58 % of the
    #: time, the engine's prefill slower beside its kernels); cold, its two compiles take 112 + 146 s
    #: (27 + 33 s from a warm cache: ``serving.kernelCache``).
    codec_compile: str = "off"
    #: The fused prefill's per-row work from CUDA graphs, per row bucket (CUDA, with ``cuda_graphs``).
    #: On since the side-by-side H200 run of 2026-12-02 (benchmarks/inference_h200/2026-12-02-graphs:
    #: a prefill call's host time 40 -> 9 ms, logits bit-identical; served c=64 2,047 -> 2,626 frames/s).
    prefill_graphs: bool = True
    #: The interpreter's thread switch interval (``sys.setswitchinterval``) in ms; 0 = Python's own
    #: (5 ms). The engine, codec and event-loop threads share one GIL: a thread that gives it up
    #: for a kernel launch may wait a whole interval to get it back.
    gil_switch_ms: float = 0.0
    #: Once the warm-up generation is done, one full garbage collection and ``gc.freeze()``: the
    #: ~219k objects start-up leaves (torch, the server's modules, the model) are skipped by every later
    #: collection, whose full passes otherwise stop every thread for ~80 ms each on a CPU box
    #: (``inference/gc_pauses.py``); their pauses are on ``inference_gc_pause_seconds`` either way.
    gc_freeze: bool = True
    #: Prefill a cloned voice's prompt head once and reuse its K/V: at a live session's open (the
    #: write-up's real-time mode) and across the segments of a long text (inference/prefix.py).
    prefix_reuse: bool = True
    #: Longest a voice-head prefix job that no text waits for yet lets clocked requests go first, in
    #: ms (``inference.admission_order``; 0 = plain FIFO, the order before 2026-12-05).
    prefix_job_wait_ms: float = 1000.0
    #: Decode audio in a child process that loads the same codec (its own interpreter, so the codec's
    #: Python work does not share the engine thread's GIL; a second CUDA context on the GPU, shared
    #: through MPS: ``mps``). None: the GPU class's catalog default on a GPU (on for the H200,
    #: measured 2026-12-03d), else off.
    codec_process: bool | None = None
    #: CUDA's Multi-Process Service for the codec process (``inference/mps.py``): ``auto``, ``on``,
    #: ``off``. Without it the two CUDA contexts time-slice the GPU (12 % slower than the codec
    #: thread on the H200); under it 22 % faster (benchmarks/inference_h200/2026-12-03d).
    mps: str = "auto"
    catalog: str = ""  # GPU catalog file merged over the built-in classes ("" = the built-in catalog)
    #: The run's catalog, loaded by :meth:`resolve` from ``catalog``: class defaults, ``auto``
    #: quantization and the kernel dispatch all come from it.
    gpu_catalog: GpuCatalog | None = field(default=None, init=False, repr=False, compare=False)

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None, **flags: Any) -> ServeConfig:
        """Build from the environment, then apply non-None ``flags``; validate into one config."""
        env = dict(os.environ if env is None else env)
        raw: dict[str, Any] = dict(read_server_env(env))
        raw.update({k: v for k, v in flags.items() if v is not None})
        cfg = cls()
        for key, value in raw.items():
            setattr(cfg, key, _coerce(key, value, getattr(cfg, key)))
        cfg.resolve()
        _check_process_switches(env)
        return cfg

    def resolve(self) -> None:
        """Fill derived values from the GPU catalog and check ranges."""
        from ttsfleet.catalog import GpuCatalog, UnknownGpuClass, cuda_graph_max_bs

        self.gpu_catalog = GpuCatalog.load(self.catalog)  # a bad file: one-line UserError
        gpu = None
        if self.gpu_class:
            try:
                gpu = self.gpu_catalog.get(self.gpu_class)
            except UnknownGpuClass as exc:
                raise UserError(str(exc)) from None
        if self.max_running_requests == 0:
            self.max_running_requests = gpu.serving.max_running_requests if gpu else 16
        _at_least(1, max_running_requests=self.max_running_requests)
        if self.codec_process is None:  # a class's default on its GPU, never on the CPU
            self.codec_process = bool(gpu and self.device != "cpu" and gpu.serving.codec_process)
        if not self.codec_layout.strip():  # likewise the codec's conv layout
            self.codec_layout = gpu.serving.codec_layout if gpu and self.device != "cpu" else "ncl"
        if self.codec_gather_ms is None:  # and its gather window
            self.codec_gather_ms = gpu.serving.codec_gather_ms if gpu and self.device != "cpu" else 0.0
        if self.max_queue == 0:
            self.max_queue = DEFAULT_QUEUE_PER_SLOT * self.max_running_requests
        _at_least(1, max_queue=self.max_queue)
        if self.cuda_graph_max_bs == 0:
            self.cuda_graph_max_bs = cuda_graph_max_bs(self.max_running_requests)
        if not 1 <= self.cuda_graph_max_bs <= self.max_running_requests:
            raise UserError(f"cuda_graph_max_bs {self.cuda_graph_max_bs} must be in [1, max_running_requests="
                            f"{self.max_running_requests}]")
        self.quantization = parse_quantization(self.quantization)
        if self.quantization == AUTO and gpu is not None:
            self.quantization = gpu.quantization
        self._check_ranges()
        if not self.model_name:
            self.model_name = "tiny" if self.checkpoint == "tiny" else Path(self.checkpoint).name
        if self.references_dir:
            Path(self.references_dir).mkdir(parents=True, exist_ok=True)

    def _check_ranges(self) -> None:
        self.codec_compile = self.codec_compile.strip().lower() or "off"
        if self.codec_compile not in ("off", *CODEC_COMPILE_MODES):
            raise UserError(f"codec compile mode {self.codec_compile!r} (--codec-compile / "
                            f"{ENV['codec_compile']}) is not off, {' or '.join(CODEC_COMPILE_MODES)}")
        self.codec_layout = self.codec_layout.strip().lower()
        if self.codec_layout not in CODEC_LAYOUTS:
            raise UserError(f"codec layout {self.codec_layout!r} (--codec-layout / {ENV['codec_layout']}) "
                            f"is not {' or '.join(CODEC_LAYOUTS)}")
        self.mps = check_mps_mode(self.mps, f"--mps / {ENV['mps']}")
        self.preset_text = self.preset_text.strip().lower()
        if self.preset_text not in PRESET_TEXTS:
            raise UserError(f"preset text {self.preset_text!r} (--preset-text / {ENV['preset_text']}) is not "
                            f"{' or '.join(PRESET_TEXTS)}")
        if self.device not in ("auto", "cpu", "cuda") and not self.device.startswith("cuda:"):
            raise UserError(f"device {self.device!r} is not auto, cpu or cuda[:N]")
        if not 1 <= self.port <= 65535:
            raise UserError(f"port {self.port} is out of range")
        _at_least(0, cpu_threads=self.cpu_threads, prefill_chunk_tokens=self.prefill_chunk_tokens,
                  prefill_coalesce_ms=self.prefill_coalesce_ms, codec_gather_ms=self.codec_gather_ms,
                  body_timeout_s=self.body_timeout_s, gil_switch_ms=self.gil_switch_ms,
                  prefix_job_wait_ms=self.prefix_job_wait_ms)
        _at_least(1, max_text_chars=self.max_text_chars, max_new_tokens=self.max_new_tokens)
        from ttsfleet.inference.model_config import PRESETS  # random-weight presets (tiny, s2-pro, ...)

        if self.checkpoint not in PRESETS and not Path(self.checkpoint).is_dir():
            raise UserError(f"checkpoint {self.checkpoint!r} is not a directory or a preset "
                            f"({', '.join(PRESETS)})")


#: The modules that define a :class:`ttsfleet.switches.ProcessSwitch`: importing them registers their
#: switches for :func:`_check_process_switches` (``tests/core/test_switches.py`` fails if a module of
#: the source tree defines one and is missing here).
SWITCH_MODULES = ("ttsfleet.inference.model_layers", "ttsfleet.kernels.decode",
                  "ttsfleet.inference.codec_batch", "ttsfleet.inference.engine_messages",
                  "ttsfleet.inference.mps", "ttsfleet.inference.prefill_graphs",
                  "ttsfleet.inference.prefill_stream", "ttsfleet.inference.engine_checks",
                  "ttsfleet.inference.mixed_step", "ttsfleet.inference.server_loop",
                  "ttsfleet.inference.mixed_graphs")


def _check_process_switches(env: dict[str, str]) -> None:
    """The model's process-wide switches, read from the environment at first use (deep inside a
    prefill or a decode step), checked now: a bad value is a one-line error at start, not a
    traceback in every request of a server that said it was ready. Every registered switch is
    checked (in variable-name order), not a hand-kept list a new one could be missing from."""
    from ttsfleet.switches import registered

    for module in SWITCH_MODULES:
        importlib.import_module(module)
    for switch in registered():
        if switch.env in env:
            try:
                switch.parse(env[switch.env])
            except ValueError as exc:
                raise UserError(str(exc)) from None


#: Switches whose unset default (None) the GPU class's catalog entry fills in :meth:`ServeConfig.resolve`.
_BOOL_OR_CATALOG = frozenset({"codec_process"})
#: Numbers whose unset default (None) the GPU class's catalog entry fills likewise.
_FLOAT_OR_CATALOG = frozenset({"codec_gather_ms"})


def _coerce(key: str, value: Any, default: Any) -> Any:
    """One raw value (env string or flag) into the type of its default, or a UserError naming it."""
    try:
        if key == "api_keys":
            items = value.split(",") if isinstance(value, str) else value
            return tuple(k.strip() for k in items if k.strip())
        if isinstance(default, bool) or key in _BOOL_OR_CATALOG:
            return _bool(key, value)
        if isinstance(default, int):
            return int(value)
        if isinstance(default, float) or key in _FLOAT_OR_CATALOG:
            return float(value)
        return value
    except ValueError:
        raise UserError(f"{ENV.get(key, key)}: {value!r} is not a valid {type(default).__name__}") from None


#: The words a yes/no switch accepts from the environment (a CLI flag passes a bool, read as its name).
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def _bool(key: str, value: Any) -> bool:
    """A yes/no switch, or a UserError naming its variable: a typo (``TTSFLEET_GC_FREEZE=maybe``) stops
    the start with one line instead of silently meaning off."""
    word = str(value).strip().lower()
    if word not in (*_TRUE, *_FALSE):
        raise UserError(f"{ENV.get(key, key)}: {value!r} is not one of {', '.join(_TRUE)} (on) or "
                        f"{', '.join(_FALSE)} (off)")
    return word in _TRUE


def _at_least(low: int, **values: float) -> None:
    for name, value in values.items():
        if not math.isfinite(value):
            raise UserError(f"{name} must be a finite number >= {low}")
        if value < low:
            raise UserError(f"{name} must be >= {low}")
