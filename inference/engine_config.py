"""The engine's settings (:class:`EngineConfig`: the server fills it from ``ServeConfig``) and the
decode batch sizes it captures CUDA graphs for."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ttsfleet.inference.admission_order import BACKGROUND_MAX_WAIT_S

if TYPE_CHECKING:
    from ttsfleet.inference.codec_process import CodecSource

#: Main-token history the sampler looks at (fish-speech: repetition-aware sampling window).
DEFAULT_WINDOW = 16


@dataclass
class EngineConfig:
    """Everything the engine is told at start; the defaults suit a CPU test, the server sets the
    rest from the GPU catalog and ``ServeConfig``."""

    max_running_requests: int = 16
    max_queue: int = 64
    cuda_graph_max_bs: int = 16
    max_seq_len: int | None = None
    #: Prompt tokens prefilled per loop iteration (>= 1), all in one batched ``model.prefill_batch``.
    prefill_token_budget: int = 2048
    #: Largest piece of one prompt an iteration prefills; a longer prompt is prefilled over several
    #: loop iterations, one chunk per iteration, with decode steps in between. 0 = whole prompts.
    prefill_chunk_tokens: int = 256
    #: Hold newly arrived prompts back up to this long while a batch decodes, so several share one
    #: prefill call (a call costs the host about the same for one prompt or many; see
    #: :mod:`ttsfleet.inference.prefill_coalesce`). 0 = prefill every arrival at the next iteration.
    prefill_coalesce_s: float = 0.0
    #: With this many prompts waiting (or a full token budget of them) the prefill runs at once.
    prefill_coalesce_prompts: int = 4
    #: Longest a background prefix-only job (no text waits for it yet) lets requests whose
    #: first-audio clock runs go first, in seconds since it was submitted; then it counts as one of
    #: them (:mod:`ttsfleet.inference.admission_order`). 0 = plain FIFO, continuations first.
    prefix_job_max_wait_s: float = BACKGROUND_MAX_WAIT_S
    window: int = DEFAULT_WINDOW
    device: str = "cpu"
    #: Pad each decode batch up to the next captured size (CUDA graphs); padded rows use a scratch slot.
    pad_to_buckets: bool = False
    #: torch intra-op threads for the engine and codec threads (0 = leave torch's default). On a
    #: shared CPU, more threads than free cores make OpenMP spin: 1 is much faster there.
    cpu_threads: int = 0
    #: Capture one CUDA graph of ``model.decode_step`` per batch bucket at start (CUDA only; needs
    #: ``pad_to_buckets``). A capture failure logs and falls back to eager decoding.
    cuda_graphs: bool = False
    #: Decode steps launched before the host reads a step's frames (0 = read each step at once). With
    #: 1 the host handles step k's frames while the GPU runs step k+1: no per-step host barrier; a
    #: row that ended at step k decodes one frame too many, which is dropped.
    pipeline_depth: int = 1
    #: Largest number of frames one batched codec call decodes per request.
    codec_max_frames: int = 8
    #: Longest a chunk of codes waits for other streams' chunks to share its codec push, in ms
    #: (:mod:`ttsfleet.inference.codec_gather`; first audio and streams about to run dry never wait);
    #: 0 = decode whatever waits at once.
    codec_gather_ms: float = 0.0
    #: The batched codec decoder's convolutions in channels-last (cuDNN's NHWC kernels; see
    #: ``ServeConfig.codec_layout``); False: the NCL layout.
    codec_channels_last: bool = False
    #: Replay batched codec calls from CUDA graphs (CUDA only), every stream-count bucket up to
    #: ``max_running_requests`` x every frame count up to ``codec_max_frames`` captured when the codec
    #: thread starts (captures during load stalled the stream:
    #: benchmarks/inference_h200/2026-12-01-served/run3-codec-graphs). The server turns it on with
    #: ``cuda_graphs``; eager codec calls keep a Python thread launching ~250 kernels per call.
    codec_graphs: bool = False
    #: ``torch.compile`` mode of the batched codec decode (None: eager; else one of
    #: :data:`ttsfleet.inference.codec.COMPILE_MODES`): compiled when the codec thread starts, before
    #: its graphs are captured, so the graphs replay Inductor's fused kernels (issue #25). A compile
    #: failure logs one warning and the codec decodes eagerly. Off until measured on a GPU
    #: (benchmarks/inference_h200/codec_compile.py).
    codec_compile: str | None = None
    #: Replay the fused prefill's per-row work (everything but attention) from CUDA graphs, one set
    #: per row bucket up to ``prefill_token_budget`` (CUDA only; needs ``pad_to_buckets`` for the
    #: scratch slot): a prefill call costs the host ~1/25 of the launches
    #: (:mod:`ttsfleet.inference.prefill_graphs`). A capture failure logs and prefills eagerly.
    prefill_graphs: bool = False
    #: Run prefill calls on a CUDA stream of their own beside the decode steps, each prompt joining the
    #: batch once its call is done (:mod:`ttsfleet.inference.prefill_stream`); None: the process switch
    #: ``TTSFLEET_PREFILL_STREAM`` (``auto`` by default: on with a CUDA device, +7.6 / +10.2 % frames/s
    #: at c=64 / 128 on an H100, 2026-12-06e). On the CPU (``on``) only the deferred landing runs.
    prefill_stream: bool | None = None
    #: Share of the free GPU memory the KV cache may take; the context per slot shrinks to fit.
    kv_cache_memory_fraction: float = 0.5
    #: The slow model's KV cache: ``auto`` (the model's dtype) or ``fp8`` (e4m3 + one exponent per
    #: position and KV head: about half the bytes, so twice the context fits; see inference/model.py).
    kv_dtype: str = "auto"
    #: Decode audio in a child process that loads its codec from here, instead of in the codec thread
    #: (:mod:`ttsfleet.inference.codec_process`: the codec's Python work off the engine's GIL). None:
    #: the codec thread. The engine's own ``codec`` must be the same codec (the server's sample rate
    #: and voice encoding use it).
    codec_process: CodecSource | None = None


def batch_buckets(max_bs: int) -> list[int]:
    """Decode batch sizes a CUDA graph is captured for: 1, 2, 4, 8, then steps of 8 up to ``max_bs``."""
    sizes = [b for b in (1, 2, 4, 8) if b < max_bs]
    sizes += list(range(16, max_bs, 8))
    return sorted(set(sizes + [max_bs]))
