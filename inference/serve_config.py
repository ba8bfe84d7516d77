"""``ServeConfig``: what ``ttsfleet serve`` runs with — defaults < ``TTSFLEET_*`` environment < CLI flags.

The operator configures replicas through the environment; the names live in :data:`ENV` so the
operator imports them instead of copying strings. Safe defaults: the server binds 127.0.0.1 unless
told otherwise (``--host 0.0.0.0`` / ``TTSFLEET_HOST=0.0.0.0`` in a pod) and needs no key unless
``TTSFLEET_API_KEYS`` / ``--api-key`` sets some.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ttsfleet.errors import UserError

#: Environment variables the server reads (flags override them). The operator sets these.
ENV = {
    "host": "TTSFLEET_HOST",
    "port": "TTSFLEET_PORT",
    "checkpoint": "TTSFLEET_CHECKPOINT",
    "model_name": "TTSFLEET_MODEL_NAME",
    "gpu_class": "TTSFLEET_GPU_CLASS",
    "quantization": "TTSFLEET_QUANTIZATION",
    "max_running_requests": "TTSFLEET_MAX_RUNNING_REQUESTS",
    "cuda_graph_max_bs": "TTSFLEET_CUDA_GRAPH_MAX_BS",
    "max_queue": "TTSFLEET_MAX_QUEUE",
    "device": "TTSFLEET_DEVICE",
    "api_keys": "TTSFLEET_API_KEYS",
    "references_dir": "TTSFLEET_REFERENCES_DIR",
    "max_text_chars": "TTSFLEET_MAX_TEXT_CHARS",
    "max_new_tokens": "TTSFLEET_MAX_NEW_TOKENS",
    "drain_grace_s": "TTSFLEET_DRAIN_GRACE_S",
    "drain_timeout_s": "TTSFLEET_DRAIN_TIMEOUT_S",
    "seed": "TTSFLEET_SEED",
    "cpu_threads": "TTSFLEET_CPU_THREADS",
    "cuda_graphs": "TTSFLEET_CUDA_GRAPHS",
    "prefill_chunk_tokens": "TTSFLEET_PREFILL_CHUNK_TOKENS",
}
QUANTIZATIONS = ("auto", "none", "bsgemm_fp8", "mxfp8")


@dataclass
class ServeConfig:
    """Serving configuration: defaults < environment (``TTSFLEET_*``) < CLI flags."""

    host: str = "127.0.0.1"  # loopback unless told: a pod passes TTSFLEET_HOST=0.0.0.0
    port: int = 8000
    checkpoint: str = "tiny"  # "tiny" = embedded deterministic random weights (noise-like audio)
    model_name: str = ""
    gpu_class: str = ""
    quantization: str = "auto"
    max_running_requests: int = 0  # 0 = the GPU class default (or 16 on CPU)
    max_queue: int = 0  # 0 = 4 x max_running_requests
    device: str = "auto"
    api_keys: tuple[str, ...] = ()
    references_dir: str = ""
    max_text_chars: int = 4096  # OpenAI's limit for /v1/audio/speech input
    max_new_tokens: int = 2048
    max_body_bytes: int = 32 * 1024 * 1024
    drain_grace_s: float = 0.0
    drain_timeout_s: float = 600.0
    seed: int = 0
    cpu_threads: int = 1  # torch threads when serving on CPU (1 avoids OpenMP oversubscription)
    cuda_graph_max_bs: int = 0  # 0 = ttsfleet.catalog.cuda_graph_max_bs(max_running_requests)
    cuda_graphs: bool = True  # capture decode graphs when serving on CUDA
    prefill_chunk_tokens: int = 256  # prompt tokens per prefill chunk (0 = whole prompts, no chunking)

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None, **flags: Any) -> ServeConfig:
        """Build from the environment, then apply non-None ``flags``; validate into one config."""
        env = dict(os.environ if env is None else env)
        raw: dict[str, Any] = {key: env[var].strip() for key, var in ENV.items() if env.get(var, "").strip()}
        raw.update({k: v for k, v in flags.items() if v is not None})
        cfg = cls()
        for key, value in raw.items():
            setattr(cfg, key, _coerce(key, value, getattr(cfg, key)))
        cfg.resolve()
        return cfg

    def resolve(self) -> None:
        """Fill derived values from the GPU catalog and check ranges."""
        from ttsfleet.catalog import GpuCatalog, UnknownGpuClass, cuda_graph_max_bs

        gpu = None
        if self.gpu_class:
            try:
                gpu = GpuCatalog.default().get(self.gpu_class)
            except UnknownGpuClass as exc:
                raise UserError(str(exc)) from None
        if self.max_running_requests == 0:
            self.max_running_requests = gpu.serving.max_running_requests if gpu else 16
        _at_least(1, max_running_requests=self.max_running_requests)
        if self.max_queue == 0:
            self.max_queue = 4 * self.max_running_requests
        _at_least(1, max_queue=self.max_queue)
        if self.cuda_graph_max_bs == 0:
            self.cuda_graph_max_bs = cuda_graph_max_bs(self.max_running_requests)
        if not 1 <= self.cuda_graph_max_bs <= self.max_running_requests:
            raise UserError(f"cuda_graph_max_bs {self.cuda_graph_max_bs} must be in [1, max_running_requests="
                            f"{self.max_running_requests}]")
        if self.quantization not in QUANTIZATIONS:
            raise UserError(f"quantization {self.quantization!r} is not one of {', '.join(QUANTIZATIONS)}")
        if self.quantization == "auto" and gpu is not None:
            self.quantization = "none" if gpu.quantization == "bf16" else gpu.quantization
        self._check_ranges()
        if not self.model_name:
            self.model_name = "tiny" if self.checkpoint == "tiny" else Path(self.checkpoint).name
        if self.references_dir:
            Path(self.references_dir).mkdir(parents=True, exist_ok=True)

    def _check_ranges(self) -> None:
        if self.device not in ("auto", "cpu", "cuda") and not self.device.startswith("cuda:"):
            raise UserError(f"device {self.device!r} is not auto, cpu or cuda[:N]")
        if not 1 <= self.port <= 65535:
            raise UserError(f"port {self.port} is out of range")
        _at_least(0, cpu_threads=self.cpu_threads, prefill_chunk_tokens=self.prefill_chunk_tokens)
        _at_least(1, max_text_chars=self.max_text_chars, max_new_tokens=self.max_new_tokens)
        if self.checkpoint != "tiny" and not Path(self.checkpoint).is_dir():
            raise UserError(f"checkpoint {self.checkpoint!r} is not a directory (or 'tiny')")


def _coerce(key: str, value: Any, default: Any) -> Any:
    """One raw value (env string or flag) into the type of its default, or a UserError naming it."""
    try:
        if key == "api_keys":
            items = value.split(",") if isinstance(value, str) else value
            return tuple(k.strip() for k in items if k.strip())
        if isinstance(default, bool):
            return str(value).lower() in ("1", "true", "yes")
        if isinstance(default, int):
            return int(value)
        if isinstance(default, float):
            return float(value)
        return value
    except ValueError:
        raise UserError(f"{ENV.get(key, key)}: {value!r} is not a valid {type(default).__name__}") from None


def _at_least(low: int, **values: int) -> None:
    for name, value in values.items():
        if value < low:
            raise UserError(f"{name} must be >= {low}")
