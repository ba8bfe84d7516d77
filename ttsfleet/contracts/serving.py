"""The serving door: what the operator hands an inference server pod, and how the server reads it.

The server (``ttsfleet serve``: defaults < these variables < flags) reads the ``TTSFLEET_*``
variables and the operator writes them into each pool's pod template, so both import the names
from here instead of typing them twice. Light on purpose (no torch, no pydantic): the operator
imports it without the inference stack.

:data:`SERVER_ENV` maps each ``ServeConfig`` field to its variable; the constants name the ones
the operator sets. The catalog hand-off: the operator renders its run's GPU catalog
(:meth:`ttsfleet.catalog.GpuCatalog.to_yaml`) into a ConfigMap, mounts it at
:data:`CATALOG_DIR` and sets :data:`CATALOG` to :data:`CATALOG_PATH`, so a server on a class added
by a catalog file knows that class. ``tests/doors/test_serving_door.py`` crosses this door for
every class of a run's catalog.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

PREFIX = "TTSFLEET_"

#: The port an inference server listens on in a pod (and by default anywhere).
INFERENCE_PORT = 8000
#: Where the run's catalog is mounted in a server pod, the file's key, and the path ``CATALOG`` names.
CATALOG_DIR = "/etc/ttsfleet/catalog"
CATALOG_KEY = "catalog.yaml"
CATALOG_PATH = f"{CATALOG_DIR}/{CATALOG_KEY}"

HOST = "TTSFLEET_HOST"
PORT = "TTSFLEET_PORT"
CHECKPOINT = "TTSFLEET_CHECKPOINT"
MODEL_NAME = "TTSFLEET_MODEL_NAME"
GPU_CLASS = "TTSFLEET_GPU_CLASS"
#: A scheme of :mod:`ttsfleet.quantization` (``auto`` | ``bsgemm_fp8`` | ``mxfp8`` | ``bf16``).
QUANTIZATION = "TTSFLEET_QUANTIZATION"
MAX_RUNNING_REQUESTS = "TTSFLEET_MAX_RUNNING_REQUESTS"
CUDA_GRAPH_MAX_BS = "TTSFLEET_CUDA_GRAPH_MAX_BS"
MAX_QUEUE = "TTSFLEET_MAX_QUEUE"
#: The server's queue bound when ``max_queue`` is 0 (its default), per decode slot: a replica refuses
#: with 429 once this many x ``max_running_requests`` requests wait beyond its free slots (the
#: simulator models the same bound).
DEFAULT_QUEUE_PER_SLOT = 4
DEVICE = "TTSFLEET_DEVICE"
API_KEYS = "TTSFLEET_API_KEYS"  # comma-separated
REFERENCES_DIR = "TTSFLEET_REFERENCES_DIR"
MAX_TEXT_CHARS = "TTSFLEET_MAX_TEXT_CHARS"
MAX_NEW_TOKENS = "TTSFLEET_MAX_NEW_TOKENS"
DRAIN_GRACE_S = "TTSFLEET_DRAIN_GRACE_S"
DRAIN_TIMEOUT_S = "TTSFLEET_DRAIN_TIMEOUT_S"
BODY_TIMEOUT_S = "TTSFLEET_BODY_TIMEOUT_S"
SEED = "TTSFLEET_SEED"
CPU_THREADS = "TTSFLEET_CPU_THREADS"
CUDA_GRAPHS = "TTSFLEET_CUDA_GRAPHS"
PREFILL_CHUNK_TOKENS = "TTSFLEET_PREFILL_CHUNK_TOKENS"
#: Milliseconds a newly arrived prompt may wait for others to share its prefill call while a batch
#: decodes (``ttsfleet.inference.prefill_coalesce``); 0 = off.
PREFILL_COALESCE_MS = "TTSFLEET_PREFILL_COALESCE_MS"
#: Milliseconds a chunk of codes may wait for other streams' chunks to share its codec push
#: (``ttsfleet.inference.codec_gather``; first audio and streams about to run dry never wait); 0 = off.
CODEC_GATHER_MS = "TTSFLEET_CODEC_GATHER_MS"
#: The codec decoder's memory layout: ``ncl`` (the default) or ``channels-last`` (cuDNN's NHWC
#: convolutions, :data:`CODEC_LAYOUTS`).
CODEC_LAYOUT = "TTSFLEET_CODEC_LAYOUT"
#: How a random-weight preset checkpoint (``s2-pro``, ...) tokenizes text: ``bytes`` (the default) or
#: ``qwen-bpe`` (Qwen's BPE, S2 Pro's text vocabulary: prompts of the real model's length).
PRESET_TEXT = "TTSFLEET_PRESET_TEXT"
PRESET_TEXTS: tuple[str, ...] = ("bytes", "qwen-bpe")
CODEC_LAYOUTS: tuple[str, ...] = ("ncl", "channels-last")
#: ``1`` (the default): the codec runs bf16 with the fused Snake kernel, replayed from CUDA graphs
#: for every stream-count bucket (CUDA only); ``0``: float32, eager.
CODEC_FAST = "TTSFLEET_CODEC_FAST"
#: ``off`` (the default) or a ``torch.compile`` mode of :data:`CODEC_COMPILE_MODES`: the batched codec
#: decode compiled by Inductor before its CUDA graphs are captured (issue #25; not yet measured on a
#: GPU, hence off).
CODEC_COMPILE = "TTSFLEET_CODEC_COMPILE"
#: The ``torch.compile`` modes the codec accepts: those that leave CUDA graphs to the codec's own
#: bucketed graphs (``reduce-overhead`` and ``max-autotune`` capture graphs of their own).
CODEC_COMPILE_MODES: tuple[str, ...] = ("default", "max-autotune-no-cudagraphs")
#: ``1`` (the default): the fused prefill's per-row work replays from CUDA graphs, one set per row
#: bucket (``ttsfleet.inference.prefill_graphs``; CUDA only, with ``CUDA_GRAPHS``); ``0``: eager.
PREFILL_GRAPHS = "TTSFLEET_PREFILL_GRAPHS"
#: The interpreter's thread switch interval in ms (``sys.setswitchinterval``); 0 = Python's 5 ms.
GIL_SWITCH_MS = "TTSFLEET_GIL_SWITCH_MS"
#: ``1`` (the default): once the warm-up generation is done, one full garbage collection and
#: ``gc.freeze()`` move start-up's objects (modules, the model, warm-up) out of the collector's later
#: passes (``ttsfleet.inference.gc_pauses``); ``0``: every full pass walks them all.
GC_FREEZE = "TTSFLEET_GC_FREEZE"
#: ``1`` (the default): a cloned voice's prompt head is prefilled once and reused, at a live
#: session's open (real-time mode) and across a long text's segments; ``0``: every prompt whole.
PREFIX_REUSE = "TTSFLEET_PREFIX_REUSE"
#: Milliseconds a live session's voice-head prefix job no text waits for yet lets requests whose first
#: audio is awaited go first (``ttsfleet.inference.admission_order``, default 1000); 0 = plain FIFO.
PREFIX_JOB_WAIT_MS = "TTSFLEET_PREFIX_JOB_WAIT_MS"
#: ``1``: decode audio in a child process (``ttsfleet.inference.codec_process``: the codec's Python
#: work off the engine's interpreter); ``0``: in the engine process's codec thread. Unset: the GPU
#: class's catalog default on a GPU (``serving.codec_process``: on for the H200), else ``0``.
CODEC_PROCESS = "TTSFLEET_CODEC_PROCESS"
#: ``auto`` (the default): with the codec process on CUDA, run under CUDA's MPS (the node's daemon
#: where ``CUDA_MPS_PIPE_DIRECTORY`` is set, else one the server starts); ``on``: required; ``off``.
MPS = "TTSFLEET_MPS"
MPS_MODES: tuple[str, ...] = ("auto", "on", "off")
#: Path of the run's GPU catalog file (``GpuCatalog.load``), so a server on a class added by a
#: catalog file knows that class (its scheme, limits and kernel dispatch); empty = the built-in one.
CATALOG = "TTSFLEET_CATALOG"

#: ``ServeConfig`` field -> environment variable, in the server's order.
SERVER_ENV: Mapping[str, str] = MappingProxyType({
    "host": HOST,
    "port": PORT,
    "checkpoint": CHECKPOINT,
    "model_name": MODEL_NAME,
    "gpu_class": GPU_CLASS,
    "quantization": QUANTIZATION,
    "max_running_requests": MAX_RUNNING_REQUESTS,
    "cuda_graph_max_bs": CUDA_GRAPH_MAX_BS,
    "max_queue": MAX_QUEUE,
    "device": DEVICE,
    "api_keys": API_KEYS,
    "references_dir": REFERENCES_DIR,
    "max_text_chars": MAX_TEXT_CHARS,
    "max_new_tokens": MAX_NEW_TOKENS,
    "drain_grace_s": DRAIN_GRACE_S,
    "drain_timeout_s": DRAIN_TIMEOUT_S,
    "body_timeout_s": BODY_TIMEOUT_S,
    "seed": SEED,
    "cpu_threads": CPU_THREADS,
    "cuda_graphs": CUDA_GRAPHS,
    "prefill_chunk_tokens": PREFILL_CHUNK_TOKENS,
    "prefill_coalesce_ms": PREFILL_COALESCE_MS,
    "codec_gather_ms": CODEC_GATHER_MS,
    "codec_layout": CODEC_LAYOUT,
    "preset_text": PRESET_TEXT,
    "codec_fast": CODEC_FAST,
    "codec_compile": CODEC_COMPILE,
    "prefill_graphs": PREFILL_GRAPHS,
    "gil_switch_ms": GIL_SWITCH_MS,
    "gc_freeze": GC_FREEZE,
    "prefix_reuse": PREFIX_REUSE,
    "prefix_job_wait_ms": PREFIX_JOB_WAIT_MS,
    "codec_process": CODEC_PROCESS,
    "mps": MPS,
    "catalog": CATALOG,
})


def read_server_env(env: Mapping[str, str]) -> dict[str, str]:
    """The contract's variables that are set and not blank, as ``{field: stripped value}``."""
    return {field: env[var].strip() for field, var in SERVER_ENV.items()
            if env.get(var, "").strip() != ""}
