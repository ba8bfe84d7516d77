"""The Fish "modded DAC" codec: reference audio → prompt codes (voice cloning), codes → 44.1 kHz audio.

Why it lives here and not behind a library: the released ``codec.pth`` needs the reference's exact
causal padding, weight-norm folding, L2-normalised nearest-code search and bf16 RoPE in its window
transformers; and the server needs a *streaming* decoder (frame by frame, same samples as a
one-shot decode), which the reference does not offer. Codes are ``[num_codebooks, T]``: row 0 from
the semantic codebook, rows 1.. from the residual codebooks; one frame = ``frame_length`` samples.

API::

    codec = load_codec("tiny" | "/path/to/codec.pth", device="cpu")
    codec.sample_rate, codec.frame_length, codec.num_codebooks
    codes = codec.encode(wave: np.ndarray float32 mono, sr: int)   # LongTensor[num_codebooks, T]
    wave = codec.decode(codes)                                      # np.ndarray float32 [T * frame_length]
    s = codec.stream_decoder(); s.push(codes[:, i:j]) -> np.ndarray; s.flush() -> np.ndarray

``tiny``: the golden fixture's tiny codec sizes (``codec_tiny.json``, shipped) with deterministic
random weights; its 10 codebooks (64 semantic codes, 16 residual) match the tiny DualAR model.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.fx.experimental._config as fx_config
import torch.nn.functional as F
from torch import Tensor, nn

from ttsfleet.contracts.serving import CODEC_COMPILE_MODES
from ttsfleet.errors import UserError, one_line

from .codec_layers import (
    SDPA_BACKENDS,
    CausalConv,
    CausalTransConv,
    ConvNeXt,
    ResidualUnit,
    SeqBlock,
    SlotState,
    Snake,
    WindowTransformer,
    cache_channels_last,
    cached_conv_weights,
    run,
    set_fused_units,
    uncache_channels_last,
)
from .graph_capture import on_side_stream

_TINY_JSON = Path(__file__).with_name("codec_tiny.json")
log = logging.getLogger("ttsfleet.inference.codec")

#: ``torch.compile`` modes of :class:`SlotCodecStream` (``compile_mode``): the ones that leave CUDA
#: graphs to the codec's own bucketed graphs.
COMPILE_MODES = CODEC_COMPILE_MODES

# The released S2 / S1 codec (fish_speech/configs/modded_dac_vq.yaml).
RELEASED_CONFIG: dict[str, Any] = {
    "sample_rate": 44100, "encoder_dim": 64, "encoder_rates": [2, 4, 8, 8], "decoder_dim": 1536,
    "decoder_rates": [8, 8, 4, 2], "encoder_transformer_layers": [0, 0, 0, 4],
    "decoder_transformer_layers": [4, 0, 0, 0],
    "transformer_general_config": {"block_size": 16384, "n_local_heads": -1, "head_dim": 64,
                                   "rope_base": 10000, "norm_eps": 1e-5},
    "quantizer": {
        "input_dim": 1024, "n_codebooks": 9, "codebook_size": 1024, "codebook_dim": 8,
        "downsample_factor": [2, 2], "semantic_codebook_size": 4096,
        "pre_module_and_post_module": {
            "causal": True, "window_size": 128, "input_dim": 1024,
            "config": {"block_size": 4096, "n_layer": 8, "n_head": 16, "dim": 1024, "intermediate_size": 3072,
                       "head_dim": 64, "rope_base": 10000, "norm_eps": 1e-5},
        },
    },
}


@dataclass(frozen=True)
class CodecConfig:
    raw: dict[str, Any] = field(default_factory=lambda: RELEASED_CONFIG)

    def __getitem__(self, key: str) -> Any:
        return self.raw[key]

    @property
    def quantizer(self) -> dict[str, Any]:
        return self.raw["quantizer"]

    @property
    def hop_length(self) -> int:
        return int(np.prod(self.raw["encoder_rates"]))

    @property
    def frame_length(self) -> int:
        return self.hop_length * int(np.prod(self.quantizer["downsample_factor"]))

    @property
    def latent_dim(self) -> int:
        return self.raw.get("latent_dim") or self.raw["encoder_dim"] * 2 ** len(self.raw["encoder_rates"])


class VQ(nn.Module):
    """One codebook: 1×1 in/out projections, nearest code by L2-normalised distance."""

    def __init__(self, dim: int, size: int, cdim: int) -> None:
        super().__init__()
        self.in_proj = nn.Conv1d(dim, cdim, 1)
        self.out_proj = nn.Conv1d(cdim, dim, 1)
        self.codebook = nn.Embedding(size, cdim)

    def quantize(self, z: Tensor) -> tuple[Tensor, Tensor]:
        z_e = self.in_proj(z)
        b = z_e.shape[0]
        enc = F.normalize(z_e.transpose(1, 2).reshape(-1, z_e.shape[1]))
        cb = F.normalize(self.codebook.weight)
        dist = enc.pow(2).sum(1, keepdim=True) - 2 * enc @ cb.t() + cb.pow(2).sum(1, keepdim=True).t()
        idx = (-dist).max(1)[1].view(b, -1)
        z_q = self.codebook(idx).transpose(1, 2)
        z_q = z_e + (z_q - z_e)
        return self.out_proj(z_q), idx

    def decode(self, idx: Tensor) -> Tensor:
        return self.out_proj(self.codebook(idx).transpose(1, 2))


class RVQ(nn.Module):
    def __init__(self, dim: int, n: int, size: int, cdim: int) -> None:
        super().__init__()
        self.quantizers = nn.ModuleList(VQ(dim, size, cdim) for _ in range(n))

    def quantize(self, z: Tensor) -> tuple[Tensor, Tensor]:
        z_q: Tensor | float = 0.0
        residual, codes = z, []
        for q in self.quantizers:
            zi, idx = q.quantize(residual)
            z_q = z_q + zi
            residual = residual - zi
            codes.append(idx)
        return z_q, torch.stack(codes, dim=1)

    def decode(self, codes: Tensor) -> Tensor:
        z: Tensor | float = 0.0
        for i, q in enumerate(self.quantizers):
            z = z + q.decode(codes[:, i])
        return z


def _window_transformer(spec: dict[str, Any]) -> WindowTransformer:
    c = spec["config"]
    return WindowTransformer(spec["input_dim"], c["dim"], c["n_layer"], c["n_head"], c["head_dim"],
                             c["intermediate_size"], c["norm_eps"], c["rope_base"], c["block_size"],
                             spec.get("window_size"))


class Quantizer(nn.Module):
    def __init__(self, q: dict[str, Any]) -> None:
        super().__init__()
        d = q["input_dim"]
        self.semantic_quantizer = RVQ(d, 1, q["semantic_codebook_size"], q["codebook_dim"])
        self.quantizer = RVQ(d, q["n_codebooks"], q["codebook_size"], q["codebook_dim"])
        f = q["downsample_factor"]
        self.downsample = nn.ModuleList(
            nn.ModuleList([CausalConv(d, d, k, stride=k), ConvNeXt(d)]) for k in f)
        self.upsample = nn.ModuleList(
            nn.ModuleList([CausalTransConv(d, d, k, k), ConvNeXt(d)]) for k in f[::-1])
        spec = q["pre_module_and_post_module"]
        self.pre_module = _window_transformer(spec)
        self.post_module = _window_transformer(spec)

    def encode(self, z: Tensor) -> Tensor:
        for conv, nx in self.downsample:
            z = nx(conv(z))
        z = self.pre_module(z)
        sem_z, sem_codes = self.semantic_quantizer.quantize(z)
        _, codes = self.quantizer.quantize(z - sem_z)
        return torch.cat([sem_codes, codes], dim=1)

    def decode(self, codes: Tensor, st: dict | None = None) -> Tensor:
        sem = codes[:, :1].clamp(0, self.semantic_quantizer.quantizers[0].codebook.num_embeddings - 1)
        res = codes[:, 1:].clamp(0, self.quantizer.quantizers[0].codebook.num_embeddings - 1)
        z = self.semantic_quantizer.decode(sem) + self.quantizer.decode(res)
        z = self.post_module(z, st)
        for conv, nx in self.upsample:
            z = nx(conv(z, st), st)
        return z


def _encoder_block(dim: int, stride: int, n_t: int, g: dict[str, Any]) -> SeqBlock:
    mods: list[nn.Module] = [ResidualUnit(dim // 2, d) for d in (1, 3, 9)]
    mods += [Snake(dim // 2), CausalConv(dim // 2, dim, 2 * stride, stride=stride)]
    if n_t:
        mods.append(WindowTransformer(dim, dim, n_t, dim // 64, g["head_dim"], dim * 3, g["norm_eps"],
                                      g["rope_base"], g["block_size"], 512))
    return SeqBlock(mods)


class Encoder(nn.Module):
    """Audio ``[B, 1, T]`` -> latent ``[B, latent_dim, T / hop]``: conv, four downsampling blocks (the
    last with a window transformer), Snake, conv.

    ``channels_last`` (default False, :meth:`Codec.use_encoder_channels_last` sets it): the conv stack
    runs on ``[B, C, 1, T]`` tensors in NHWC memory, as 2-D convs of height 1, through the same layer
    code as the decoder's (:class:`Decoder`, issue #25). The input has one channel, so its 4-D view
    is already NHWC memory (the first conv copies it into its history buffer, as in NCL); the window
    transformer takes the 4-D form through free views (:class:`WindowTransformer`); the latent is
    converted back to NCL once, for the quantizer (the stack's cost is in its wide, long tensors: at
    the quantizer's rates, 43 and 21.5 frames/s, its convs are negligible).
    """

    def __init__(self, cfg: CodecConfig) -> None:
        super().__init__()
        d = cfg["encoder_dim"]
        g = cfg["transformer_general_config"]
        mods: list[nn.Module] = [CausalConv(1, d, 7)]
        for stride, n_t in zip(cfg["encoder_rates"], cfg["encoder_transformer_layers"], strict=True):
            d *= 2
            mods.append(_encoder_block(d, stride, n_t, g))
        mods += [Snake(d), CausalConv(d, cfg.latent_dim, 3)]
        self.block = nn.ModuleList(mods)
        self.channels_last = False

    def forward(self, x: Tensor, channels_last: bool | None = None) -> Tensor:
        """``channels_last`` None: :attr:`channels_last`. The latent is ``[B, C, T]`` contiguous in both."""
        if not (self.channels_last if channels_last is None else channels_last):
            return run(self.block, x)
        return run(self.block, x.unsqueeze(2)).squeeze(2).contiguous()  # the one conversion


class Decoder(nn.Module):
    """Latent ``[B, C, T]`` -> audio ``[B, 1, T x hop]``: conv, four upsampling blocks, conv, tanh.

    ``channels_last`` (default False, :meth:`Codec.use_channels_last` sets it): the conv stack runs on
    ``[B, C, 1, T]`` tensors in NHWC memory, as 2-D convs of height 1 (issue #25: on the H200 every
    conv of a 64 x 4 push took 5.93 instead of 8.27 ms that way, benchmarks/inference_h200/
    codec_convs.py). The latent is converted once, straight into the first conv's input buffer, and
    the output (one channel) needs no conversion; Snake, bias and residual adds keep the layout.
    """

    def __init__(self, cfg: CodecConfig) -> None:
        super().__init__()
        ch = cfg["decoder_dim"]
        mods: list[nn.Module] = [CausalConv(cfg.latent_dim, ch, 7)]
        out = ch
        for i, stride in enumerate(cfg["decoder_rates"]):
            cin, out = ch // 2**i, ch // 2 ** (i + 1)
            mods.append(SeqBlock([Snake(cin), CausalTransConv(cin, out, 2 * stride, stride),
                                  *[ResidualUnit(out, d) for d in (1, 3, 9)]]))
        mods += [Snake(out), CausalConv(out, 1, 7), nn.Tanh()]
        self.model = nn.ModuleList(mods)
        self.channels_last = False

    def forward(self, z: Tensor, st: dict | SlotState | None = None,
                channels_last: bool | None = None) -> Tensor:
        """``channels_last`` None: :attr:`channels_last`. Either layout carries the same stream state."""
        if not (self.channels_last if channels_last is None else channels_last):
            return run(self.model, z, st)
        first = self.model[0]
        x4 = z.unsqueeze(2)
        buf = first.open(x4, st)  # channels-last: x4 is 4-D
        buf[..., first.pad:].copy_(x4)  # the one layout conversion, fused with the history concat
        x = run(self.model[1:], first.close(buf, st), st)
        return x.squeeze(2).contiguous()  # [B, 1, 1, L]: one channel, already contiguous (a no-op)


class Codec(nn.Module):
    """Encoder + downsampling residual VQ + causal decoder, at ``sample_rate`` Hz."""

    def __init__(self, cfg: CodecConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.encoder = Encoder(cfg)
        self.quantizer = Quantizer(cfg.quantizer)
        self.decoder = Decoder(cfg)
        self.sample_rate = int(cfg["sample_rate"])
        self.frame_length = cfg.frame_length
        self.num_codebooks = 1 + int(cfg.quantizer["n_codebooks"])

    @property
    def device(self) -> torch.device:
        return self.decoder.model[0].conv.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.decoder.model[0].conv.weight.dtype

    def use_channels_last(self, on: bool = True) -> None:
        """Run the decoder's conv stack channels-last (:class:`Decoder`) by default, caching each
        conv's 4-D NHWC weight (a copy beside the parameter: the parameters and ``state_dict`` keep
        the checkpoint's conv1d shapes). Call after loading or moving weights (:func:`load_codec` does)."""
        self.decoder.channels_last = on
        if on:
            cache_channels_last(self.decoder)
        else:
            uncache_channels_last(self.decoder)

    def use_encoder_channels_last(self, on: bool = True) -> None:
        """Run the encoder's conv stack channels-last (:class:`Encoder`), caching its convs' 4-D NHWC
        weights; call after loading, moving or casting the encoder's weights.

        A switch of its own, not part of :meth:`use_channels_last`: the decoder's layout is the
        server's (measured, per GPU class), the encoder's the fill job's (``codecLayout``); one switch
        would change the server's reference-audio encode with the decoder's layout, unmeasured."""
        self.encoder.channels_last = on
        if on:
            cache_channels_last(self.encoder)
        else:
            uncache_channels_last(self.encoder)

    def use_fused_units(self, on: bool = True) -> None:
        """The decoder's residual units through the fused conv kernels
        (:attr:`~ttsfleet.inference.codec_layers.ResidualUnit.fused_convs`): taken where the decoder
        runs channels-last and the kernel dispatch runs Triton, else the units run as before. Call
        after loading or moving weights (it caches the convs' ``[K, Ci, Co]`` weights)."""
        set_fused_units(self.decoder, on)

    def use_encoder_fused_units(self, on: bool = True) -> None:
        """The encoder's residual units through the same fused conv kernels (the fill job's encode:
        ``BatchEncoder``), under the same conditions (channels-last encoder, Triton dispatch, the
        width and row limits of :meth:`~ttsfleet.inference.codec_layers.ResidualUnit.takes_fused`).
        A switch of its own for the reason :meth:`use_encoder_channels_last` gives."""
        set_fused_units(self.encoder, on)

    def use_window_attention(self, backend: str) -> None:
        """The SDPA backend of the window transformers' batched pushes
        (:attr:`~ttsfleet.inference.codec_layers.WindowTransformer.slot_sdpa`): ``auto`` (torch's
        choice) or a :data:`~ttsfleet.inference.codec_layers.SDPA_BACKENDS` name, which must run on
        the codec's device (a ``ValueError`` names the choices for an unknown one)."""
        if backend != "auto" and backend not in SDPA_BACKENDS:
            raise ValueError(f"window attention backend {backend!r}: expected auto or one of "
                             f"{', '.join(SDPA_BACKENDS)}")
        for m in self.modules():
            if isinstance(m, WindowTransformer):
                m.slot_sdpa = None if backend == "auto" else backend

    def use_fused_kernels(self, on: bool = True) -> None:
        """Snake activations through :func:`ttsfleet.kernels.snake.snake` (one pass; Triton where the
        kernel dispatch runs Triton), instead of the five-pass expression."""
        for m in self.modules():
            if isinstance(m, Snake):
                m.fused = on

    @torch.inference_mode()
    def encode(self, wave: np.ndarray, sr: int) -> Tensor:
        """Mono float audio at ``sr`` Hz -> ``LongTensor[num_codebooks, ceil(len / frame_length)]``."""
        x = np.asarray(wave, dtype=np.float32)
        if x.ndim == 2:
            x = x.mean(axis=1) if x.shape[1] <= 8 else x.mean(axis=0)
        if x.ndim != 1 or x.size == 0:
            raise ValueError(f"wave must be non-empty mono audio, got shape {np.shape(wave)}")
        if sr != self.sample_rate:
            from math import gcd

            from scipy.signal import resample_poly

            g = gcd(int(sr), self.sample_rate)
            x = resample_poly(x, self.sample_rate // g, int(sr) // g).astype(np.float32)
        t = torch.from_numpy(x).to(self.device, self.dtype)[None, None]
        pad = -t.shape[-1] % self.frame_length
        t = F.pad(t, (0, pad))
        return self.quantizer.encode(self.encoder(t))[0].cpu()

    def _check_codes(self, codes: Tensor) -> Tensor:
        codes = torch.as_tensor(codes)
        if codes.dim() != 2 or codes.shape[0] != self.num_codebooks:
            raise ValueError(f"codes must be [{self.num_codebooks}, T], got {tuple(codes.shape)}")
        return codes.to(self.device, torch.long)[None]

    @torch.inference_mode()
    def decode(self, codes: Tensor) -> np.ndarray:
        """``[num_codebooks, T]`` -> float32 waveform of ``T * frame_length`` samples."""
        c = self._check_codes(codes)
        if c.shape[-1] == 0:
            return np.zeros(0, dtype=np.float32)
        wave = self.decoder(self.quantizer.decode(c))
        return wave[0, 0].float().cpu().numpy()

    def stream_decoder(self) -> CodecStream:
        return CodecStream(self)

    def slot_decoder(self, max_slots: int, max_frames: int = 1 << 15, graphs: bool = False,
                     graph_max_batch: int | None = None, compile_mode: str | None = None,
                     compile_backend: str | Callable = "inductor",
                     channels_last: bool | None = None) -> SlotCodecStream:
        return SlotCodecStream(self, max_slots, max_frames=max_frames, graphs=graphs,
                               graph_max_batch=graph_max_batch, compile_mode=compile_mode,
                               compile_backend=compile_backend, channels_last=channels_last)


class CodecStream:
    """Frame-by-frame decoding with carried causal state; concatenated chunks equal :meth:`Codec.decode`."""

    def __init__(self, codec: Codec) -> None:
        self.codec = codec
        self.state: dict = {}

    @torch.inference_mode()
    def push(self, codes: Tensor) -> np.ndarray:
        c = self.codec._check_codes(codes)
        if c.shape[-1] == 0:
            return np.zeros(0, dtype=np.float32)
        wave = self.codec.decoder(self.codec.quantizer.decode(c, self.state), self.state)
        return wave[0, 0].float().cpu().numpy()

    def flush(self) -> np.ndarray:
        """Nothing is held back: the decoder is causal, every pushed frame is already complete."""
        self.state = {}
        return np.zeros(0, dtype=np.float32)


class SlotCodecStream:
    """Streaming decode of many requests in one call: stream state in slots, like the KV cache.

    ``push(slots, codes [B, ncb, T])`` advances the ``B`` streams of ``slots`` by ``T`` frames each and
    returns their audio ``[B, T * frame_length]`` (on the codec's device; with graphs, a view of a
    static buffer valid until the next push); each row equals what that request's own
    :class:`CodecStream` returns for the same codes. ``reset(slot)`` ends a stream. All rows of one
    call decode the same number of frames (the engine groups requests by it).

    ``graphs`` (CUDA): each ``(B, T)`` shape with ``B`` up to ``graph_max_batch`` is replayed from a
    CUDA graph, ``B`` padded up to the next of :func:`codec_batch_buckets` with scratch slots; a
    streaming call at S2 size is ~250 small launches, launch-bound eagerly (H200: one stream x 1
    frame 20 ms eager, 2.8 ms replayed) and a Python thread launching them starves the engine's
    (2026-12-01: the codec thread was busy 72 % of a steady c=64 run). :meth:`capture` records the
    shapes up front (a capture during load stalls the stream); a shape not captured is captured on
    first use; one whose capture fails stays eager. ``max_frames`` bounds a stream's length (RoPE
    positions of the window transformer).

    ``compile_mode`` (None: eager; else one of :data:`COMPILE_MODES`): the batched decode runs through
    ``torch.compile``, so Inductor fuses the elementwise passes around the convolutions (bias and
    residual adds, Snake, the concatenations of causal history), which eagerly are separate kernels
    (issue #25: 27 ms per 64 streams x 4 frames push on the H200, bf16 + graphs; the target is 8.5 ms).
    See :meth:`_compile` for how and :meth:`_decode` for the fallback; ``compile_backend`` is
    ``torch.compile``'s backend (tests use ``"eager"`` / ``"aot_eager"``: Dynamo's tracing and the
    state mutations without Inductor's minutes of code generation; ``compile_mode`` then does not
    apply). Graph captures record the compiled kernels.

    ``channels_last`` (None: the codec's :attr:`Decoder.channels_last`, :func:`load_codec`'s choice):
    this decoder's conv stack layout (:class:`Decoder`); the stream state is the same
    in both, only the convolutions' memory layout differs.
    """

    def __init__(self, codec: Codec, max_slots: int, max_frames: int = 1 << 15, graphs: bool = False,
                 graph_max_batch: int | None = None, compile_mode: str | None = None,
                 compile_backend: str | Callable = "inductor", channels_last: bool | None = None) -> None:
        if compile_mode is not None and compile_mode not in COMPILE_MODES:
            raise ValueError(f"codec compile mode {compile_mode!r} is not one of {', '.join(COMPILE_MODES)}")
        self.codec = codec
        self.channels_last = codec.decoder.channels_last if channels_last is None else channels_last
        if self.channels_last:
            cache_channels_last(codec.decoder)  # fresh 4-D weights (the codec may have moved since)
        self.slots = max_slots
        self.buckets = codec_batch_buckets(min(graph_max_batch or max_slots, max_slots))
        if compile_mode is not None:  # one stream is padded to two: no compile of its own
            self.buckets = [b for b in self.buckets if b >= MIN_COMPILED_ROWS] or [MIN_COMPILED_ROWS]
        self.pad = self.buckets[-1]  # scratch rows after the real ones: graphs pad B up to a bucket
        self.state = SlotState(max_slots + self.pad, max_positions=max_frames)
        self.use_graphs = graphs and codec.device.type == "cuda"
        self.graphs: dict[tuple[int, int], Any] = {}  # (B, T) -> _CodecGraph, or None = eager
        self.captured = 0
        # one memory pool for every shape: calls replay one after another on one stream and each
        # output is copied out before the next call, so their scratch memory can be shared
        self.pool = torch.cuda.graph_pool_handle() if self.use_graphs else None
        self.compile_mode = compile_mode
        #: ``torch.compile``'s backend (the start-up log names it).
        self.compile_backend = compile_backend
        #: The compiled decode (None: eager, by choice or after a failed compile).
        self.compiled: Callable[[Tensor, Tensor], Tensor] | None = None
        #: Why the compiled decode was given up (one line), or None.
        self.compile_error: str | None = None
        #: Compiles the compiled decode has run so far (:meth:`_decode` counts and logs each).
        self.compiles = 0
        self._compiled_classes: set[str] = set()
        if compile_mode is not None:
            self._compile(compile_mode, compile_backend)

    @property
    def max_slots(self) -> int:
        return self.slots

    def _check(self, slots: list[int], codes: Tensor) -> Tensor:
        codes = torch.as_tensor(codes)
        n = self.codec.num_codebooks
        if codes.dim() != 3 or codes.shape[0] != len(slots) or codes.shape[1] != n or codes.shape[2] < 1:
            raise ValueError(f"codes must be [{len(slots)}, {n}, T >= 1], got {tuple(codes.shape)}")
        if len(set(slots)) != len(slots) or not all(0 <= s < self.slots for s in slots):
            raise ValueError(f"slots must be distinct and in [0, {self.slots}): {slots}")
        return codes

    def bucket(self, n: int) -> int | None:
        """The captured batch size ``n`` streams are padded to (None: more than any bucket)."""
        return next((b for b in self.buckets if b >= n), None)

    def expected_compiles(self, frames: tuple[int, ...]) -> int:
        """How many compiles capturing ``frames`` (:meth:`capture`) should take: one per shape class
        of :func:`compile_class` among them (0 when not compiled)."""
        return len({compile_class(t) for t in frames}) if self.compiled is not None else 0

    @torch.inference_mode()
    def capture(self, frames: tuple[int, ...]) -> int:
        """Capture every bucket x ``frames`` shape now (before serving); returns how many exist.

        Without graphs but compiled, each shape class the compiled decode specializes on (one frame
        or several) is compiled now instead, on scratch rows, so no request waits for a compile."""
        if self.use_graphs:
            for t in frames:
                for b in self.buckets:
                    self._graph(b, t)
        elif self.compiled is not None:
            dev = self.codec.device
            b = MIN_COMPILED_ROWS
            for t in sorted({min(t, 2) for t in frames}):  # a frame count of each compile_class
                codes = torch.zeros(b, self.codec.num_codebooks, t, dtype=torch.long, device=dev)
                self._decode(torch.arange(self.slots, self.slots + b, device=dev), codes)
            for row in range(self.slots, self.slots + self.pad):
                self.state.reset(row)
        return sum(g is not None for g in self.graphs.values())

    @torch.inference_mode()
    def push(self, slots: list[int], codes: Tensor) -> Tensor:
        codes = self._check(slots, codes)
        size = self.bucket(len(slots)) if self.use_graphs else None
        if size is not None:
            graph = self._graph(size, int(codes.shape[2]))
            if graph is not None:
                return graph.run(self, slots, codes)
        n = len(slots)
        if self.compiled is not None and n < MIN_COMPILED_ROWS:  # scratch rows: see MIN_COMPILED_ROWS
            slots = slots + list(range(self.slots, self.slots + MIN_COMPILED_ROWS - n))
            codes = torch.cat([codes, codes.new_zeros((MIN_COMPILED_ROWS - n, *codes.shape[1:]))])
        rows = torch.tensor(slots, dtype=torch.int64).to(self.codec.device, non_blocking=True)
        codes = codes.to(self.codec.device, torch.long, non_blocking=True)
        if self.compiled is not None and not codes.is_inference():
            # the caller's own tensor (already on the device): Dynamo guards on dispatch keys, and an
            # inference tensor (what every other call passes) is another input kind: a recompile
            codes = codes.clone()
        return self._decode(rows, codes)[:n]

    def _decode(self, rows: Tensor, codes: Tensor) -> Tensor:
        """One batched streaming decode of the slots ``rows``: compiled where :meth:`_compile` set it
        up, else eager (:meth:`_decode_eager`, the same computation).

        A compiled call that raises (Dynamo or Inductor failing on a new shape, a backend that does
        not build here) logs one warning, drops the compiled decode for good and decodes eagerly: a
        slower codec, not a dead codec thread. A compile fails before the call runs, so the state
        is untouched and the eager retry decodes the same push (an error while compiled code runs,
        not seen so far, could leave that one push's state half updated). Inside a CUDA graph
        capture the error propagates instead: the capture is broken anyway, and the shape stays
        eager (:meth:`_graph`)."""
        fn = self.compiled
        if fn is not None:
            frames_before, t0 = _dynamo_frames(), time.perf_counter()
            try:
                out = fn(rows, codes)
            except Exception as exc:
                if self.use_graphs and torch.cuda.is_current_stream_capturing():
                    raise
                self._give_up_compile(exc)
            else:
                if _dynamo_frames() != frames_before:
                    self._log_compile(int(rows.shape[0]), int(codes.shape[2]), time.perf_counter() - t0)
                return out
        return self._decode_eager(rows, codes)

    def _log_compile(self, b: int, t: int, seconds: float) -> None:
        """One line per compile, so a server's log shows where its start-up goes (a cold compile of
        the S2 codec takes minutes): the shape class and the call that compiled it, and how long
        that call took. A second compile of a class already compiled is not part of the design
        (:meth:`_compile`): a guard failed, which ``TORCH_LOGS=recompiles`` names; it is a warning."""
        self.compiles += 1
        cls = compile_class(t)
        again = cls in self._compiled_classes
        self._compiled_classes.add(cls)
        note = ", compiled before: a recompile, TORCH_LOGS=recompiles says why" if again else ""
        log.log(logging.WARNING if again else logging.INFO,
                "codec decode compile %d (%s pushes%s, at %d streams x %d frames) took %.1f s",
                self.compiles, cls, note, b, t, seconds)

    def _decode_eager(self, rows: Tensor, codes: Tensor) -> Tensor:
        self.state.select(rows)
        z = self.codec.quantizer.decode(codes, self.state)
        return self.codec.decoder(z, self.state, channels_last=self.channels_last)[:, 0]

    def _compile(self, mode: str, backend: str | Callable) -> None:
        """Wrap :meth:`_decode_eager` in ``torch.compile`` (mode ``mode`` with Inductor).

        First one eager call on a scratch row (then reset): it creates every state tensor (a layer's
        first assignment allocates its slot rows), so the traced function only reads and updates
        existing tensors in place instead of creating them (which would be traced as new outputs,
        and recompiled on the next call when they exist). The state tensors are then marked static:
        with ``dynamic=True`` every other input dimension is symbolic, so the compiled code serves
        every stream count and frame count; Dynamo still specializes sizes of 1, so one stream is
        padded to :data:`MIN_COMPILED_ROWS` and two compiles (one frame or several) cover every shape
        a server captures, not one per (streams, frames) shape. Duck shaping is off: by default
        Dynamo gives sizes equal at the first trace one symbol (2 streams x 2 frames: streams ==
        frames), and every later shape breaks that guard — a compile more (measured on the tiny
        codec, CPU: five pushes of 2x2, 3x4, 1x1, 1x4, 2x1 compiled 5 times as it was, 4 without duck
        shaping, 2 with the one stream padded too). Dynamo caches on the
        function's code, shared by every decoder of the process: a process holds one serving decoder
        (its recompile limit, 8, counts the entries of all). A failure here logs one warning and
        leaves the decoder eager.

        The convs' cached weights (:func:`~ttsfleet.inference.codec_layers.cached_conv_weights`: the
        channels-last 4-D copies, the fused units' rows) are marked static too. They are plain tensor
        attributes, not parameters: those of convs Dynamo first reaches through the state's keys
        (the convs with history), and the bases of the 1x1 convs' 4-D views, were graph inputs with
        symbolic sizes (channels-last tiny codec: 11 such inputs in the one-frame compile, 14 in the
        multi-frame one, against the codes and rows alone now), each size guarded and reasoned
        about. The compile count stayed two, but the tracing took 2-3x as long (tiny codec, CPU,
        2026-12-06, Dynamo's ``eager`` backend: 12.1 and 13.6 s -> 4.5 and 5.0 s; ``aot_eager``:
        22.5-24 and 29-31 s -> 10-11.6 and 15 s; Inductor, cold caches, one run each: 70.6 and
        72.5 s -> 55.8 and 56.1 s; on a GPU unmeasured).

        Float attributes of the modules (norm epsilons, the embeddings' ``norm_type``) are
        specialized while tracing: with ``dynamic=True`` Dynamo first traces them as symbols, then
        restarts the whole trace to specialize them (twice the tracing time, measured on CPU with
        the tiny codec: 20.6 -> 9.1 s for the first compile). The patch is Dynamo's global config,
        set for the duration of each compiled call (the codec thread is the process's one
        compiler)."""
        try:
            dev = self.codec.device
            with torch.inference_mode():
                rows = torch.arange(self.slots, self.slots + 1, device=dev)
                self._decode_eager(rows, torch.zeros(1, self.codec.num_codebooks, 1, dtype=torch.long,
                                                     device=dev))
                self.state.reset(self.slots)
            for t in (*self.state.store.values(), *cached_conv_weights(self.codec)):
                torch._dynamo.mark_static(t)
            kwargs: dict[str, Any] = {"mode": mode} if backend == "inductor" else {}
            fn = torch.compile(self._decode_eager, backend=backend, dynamic=True, **kwargs)
            fn = fx_config.patch(use_duck_shape=False)(fn)
            self.compiled = torch._dynamo.config.patch(specialize_float=True)(fn)
        except Exception as exc:
            self._give_up_compile(exc)

    def _give_up_compile(self, exc: Exception) -> None:
        self.compiled = None
        self.compile_error = f"{type(exc).__name__}: {one_line(exc)}"
        log.warning("codec compile (%s) failed, decoding eagerly: %s", self.compile_mode, self.compile_error)
        log.debug("codec compile failure", exc_info=exc)

    def _graph(self, b: int, t: int) -> _CodecGraph | None:
        key = (b, t)
        if key not in self.graphs:
            try:
                self.graphs[key] = _CodecGraph.capture(self, b, t)
                self.captured += 1
            except Exception:
                log.exception("codec graph %s failed; eager", key)
                self.graphs[key] = None
        return self.graphs[key]

    @torch.inference_mode()
    def reset(self, slot: int) -> None:
        self.state.reset(slot)


#: The fewest rows a compiled decode call runs: one stream is padded with a scratch row, because
#: Dynamo specializes a size of 1 (a compile of its own, ~90 s for the S2 codec on an H100,
#: 2026-12-06) and a second row costs a 1-frame push little.
MIN_COMPILED_ROWS = 2


def compile_class(frames: int) -> str:
    """The shape class a push of ``frames`` frames runs in a compiled decode (one compile each,
    :meth:`SlotCodecStream._compile`): ``one-frame`` (Dynamo specializes a size of 1) or
    ``multi-frame`` (every other frame count, symbolic)."""
    return "one-frame" if frames == 1 else "multi-frame"


def _dynamo_frames() -> int:
    """Frames Dynamo has compiled (or tried to) in this process: a change across a compiled call
    means that call compiled. The codec's decoder is the process's one ``torch.compile`` user."""
    from torch._dynamo.utils import counters

    return int(counters["frames"]["total"])


def codec_batch_buckets(max_batch: int) -> list[int]:
    """Stream counts a codec graph is captured for: 1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, ...
    (steps of a quarter to a half of the size, so padding wastes at most a third of a call)."""
    sizes, b = [], 1
    while b < max_batch:
        sizes.append(b)
        b = b * 2 if b < 16 else b + (b // 2 if b & (b - 1) == 0 else b // 3)
    return sorted(set(sizes + [max_batch]))


class _CodecGraph:
    """One captured batched streaming call: static slot-index / codes inputs, static audio output."""

    def __init__(self, graph: Any, rows: Tensor, codes: Tensor, out: Tensor) -> None:
        self.graph, self.rows, self.codes, self.out = graph, rows, codes, out

    @classmethod
    def capture(cls, stream: SlotCodecStream, b: int, t: int) -> _CodecGraph:
        dev = stream.codec.device
        scratch = torch.arange(stream.slots, stream.slots + b, device=dev)  # warm-up writes only these
        rows = scratch.clone()
        codes = torch.zeros(b, stream.codec.num_codebooks, t, dtype=torch.long, device=dev)
        with on_side_stream(dev):
            for _ in range(2):  # allocates the state rows, picks conv algorithms
                stream._decode(rows, codes)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=stream.pool, capture_error_mode="thread_local"):
            out = stream._decode(rows, codes)
        return cls(graph, rows, codes, out)

    def run(self, stream: SlotCodecStream, slots: list[int], codes: Tensor) -> Tensor:
        b = len(slots)
        pad = list(range(stream.slots, stream.slots + self.rows.shape[0] - b))
        host_rows = torch.tensor(slots + pad, dtype=torch.int64)
        self.rows.copy_(host_rows, non_blocking=True)
        self.codes[:b].copy_(codes, non_blocking=True)
        self.graph.replay()
        return self.out[:b]


# ----------------------------------------------------------------------------- loading
def _fold_weight_norm(sd: dict[str, Tensor]) -> dict[str, Tensor]:
    """``g * v / ||v||`` (norm over all dims but 0) for both PyTorch weight-norm layouts."""
    out: dict[str, Tensor] = {}
    pairs = {".parametrizations.weight.original0": ".parametrizations.weight.original1",
             ".weight_g": ".weight_v"}
    for k, v in sd.items():
        done = False
        for gk, vk in pairs.items():
            if k.endswith(gk):
                base = k[: -len(gk)]
                vv = sd[base + vk].float()
                norm = vv.pow(2).sum(dim=tuple(range(1, vv.dim())), keepdim=True).sqrt()
                out[base + ".weight"] = v.float() * vv / norm
                done = True
            elif k.endswith(vk):
                done = True
        if not done:
            out[k] = v
    return out


def _init_random_(codec: Codec, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in codec.named_parameters():
            if name.endswith("alpha") or "norm" in name.rsplit(".", 2)[-2]:
                p.fill_(1.0) if name.endswith(("alpha", "weight")) else p.zero_()
            elif name.endswith("gamma"):
                p.fill_(0.1)
            elif name.endswith("bias"):
                p.zero_()
            elif "codebook" in name:
                p.copy_(torch.randn(p.shape, generator=gen))
            else:
                fan_in = p[0].numel() if p.dim() > 1 else p.numel()
                p.copy_(torch.randn(p.shape, generator=gen) / fan_in ** 0.5)
        # Random residual stacks grow the signal ~30x; scale the output conv so tiny audio sits near
        # -15 dBFS instead of saturating the tanh.
        codec.decoder.model[-2].conv.weight.mul_(0.015)


def codec_config_for(path: Path) -> CodecConfig:
    side = path.with_name("codec_config.json")
    if side.exists():
        return CodecConfig(json.loads(side.read_text()))
    return CodecConfig(RELEASED_CONFIG)


#: Random-weight codecs by name: the fixture's ``tiny`` and the released sizes (``s2-pro``, benchmarks).
RANDOM_PRESETS = ("tiny", "s2-pro")


def load_codec(name_or_path: str | Path = "tiny", device: str | torch.device = "cpu",
               dtype: torch.dtype = torch.float32, seed: int = 0, fast: bool = False,
               channels_last: bool | None = None) -> Codec:
    """``"tiny"`` / ``"s2-pro"`` (random weights; fixture / released sizes; any other model preset
    takes the codec of its size class) or a ``codec.pth`` (config
    from a ``codec_config.json`` beside it, else the released sizes). Mismatched keys fail listing
    missing / unexpected / mis-shaped. ``fast``: bf16 weights (``dtype`` is ignored) and the fused
    Snake kernel (:meth:`Codec.use_fused_kernels`). ``channels_last``: the decoder's conv stack
    layout (:meth:`Codec.use_channels_last`); None: :func:`default_channels_last` (NCL for now)."""
    codec = _load_codec(name_or_path, device, torch.bfloat16 if fast else dtype, seed)
    if fast:
        codec.use_fused_kernels()
    codec.use_channels_last(default_channels_last(codec.device) if channels_last is None else channels_last)
    return codec


def default_channels_last(device: torch.device) -> bool:
    """The decoder layout a codec gets when its caller names none: NCL, the golden tests' layout.

    The server names one: its GPU class's (``ServingDefaults.codec_layout``, channels-last on an
    H200). Channels-last (cuDNN's NHWC kernels) makes pushes 1.14-1.17x faster from 1 x 1 to
    128 x 4 on an H200 (S2 size, bf16, CUDA graphs; a 64 x 4 push 18.3 -> 15.7 ms; the cached 4-D
    weights cost 103 MiB beside the parameters) and served frames/s +6 % at c=64 and c=128, its
    audio 25-26 dB SNR from NCL's and as far from float32 as NCL's (20.5 vs 20.6 dB; 2026-12-04,
    benchmarks/inference_h200/2026-12-04/run7-*, run8-*). Its 128 x 4 pushes matched NCL's bit for
    bit in two processes out of three, most likely because cuDNN's autotuner (timing-based, per
    process) chose for the NCL input the same NHWC kernel behind layout transposes (NCL's push stays
    slower, as by the transposes' cost; not profiled)."""
    del device
    return False


def _load_codec(name_or_path: str | Path, device: str | torch.device, dtype: torch.dtype, seed: int) -> Codec:
    from .model_config import PRESETS

    name = str(name_or_path)
    if name in RANDOM_PRESETS or (name in PRESETS and not Path(name).exists()):  # a model preset's codec
        spec = json.loads(_TINY_JSON.read_text()) if name.startswith("tiny") else RELEASED_CONFIG
        codec = Codec(CodecConfig(spec))
        _init_random_(codec, seed)
        return codec.to(device=device, dtype=dtype).eval().requires_grad_(False)
    path = Path(name_or_path)
    if path.is_dir():
        path = path / "codec.pth"
    if not path.exists():
        raise UserError(f"codec checkpoint {path} does not exist")
    raw: Any = torch.load(path, map_location="cpu", weights_only=True)
    if isinstance(raw, dict) and "state_dict" in raw:
        raw = raw["state_dict"]
    if any(k.startswith("generator.") for k in raw):
        raw = {k[len("generator."):]: v for k, v in raw.items() if k.startswith("generator.")}
    sd = _fold_weight_norm(raw)
    codec = Codec(codec_config_for(path))
    expected = {k: tuple(v.shape) for k, v in codec.state_dict().items()}
    missing = sorted(set(expected) - set(sd))
    unexpected = sorted(set(sd) - set(expected))
    bad = sorted(f"{k} ({list(sd[k].shape)} vs {list(expected[k])})" for k in set(sd) & set(expected)
                 if tuple(sd[k].shape) != expected[k])
    if missing or unexpected or bad:
        msg = [f"codec checkpoint {path} does not match its config:"]
        for label, keys in (("missing", missing), ("unexpected", unexpected), ("mis-shaped", bad)):
            if keys:
                msg.append(f"  {label} ({len(keys)}): " + ", ".join(keys[:40]))
        raise UserError("\n".join(msg))
    codec.load_state_dict(sd, strict=True)
    return codec.to(device=device, dtype=dtype).eval().requires_grad_(False)
