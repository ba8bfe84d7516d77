"""Causal, streamable layers of the modded-DAC codec (convs, transposed convs, Snake, window attention).

Why every layer takes an optional ``st`` (stream state) dict: the codec decoder is causal end to
end, so decoding frame by frame with carried state (conv history, transposed-conv overlap tails,
attention KV within the window, absolute RoPE positions) gives the same samples as decoding the
whole code sequence at once. ``st=None`` is the one-shot path with the reference's zero padding.
Module and parameter names mirror the released ``codec.pth`` so it loads without renaming.

Two layouts, chosen by the input's rank: ``[B, C, T]`` (1-D convs, the reference's) or
``[B, C, 1, T]`` in channels-last (NHWC) memory, run as 2-D convs of height 1 (faster cuDNN kernels,
issue #25; the decoder converts once on entry, :class:`~ttsfleet.inference.codec.Decoder`, the
encoder too, :class:`~ttsfleet.inference.codec.Encoder`; its window transformer takes the 4-D form
through free views). Stream state is stored 3-D in both, so it does not depend on the layout.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .model_layers import RMSNorm, apply_rope, rope_table


class SlotState:
    """The stream state of many streams at once, one row per slot (like the decode KV cache).

    Why: one batched streaming call for every active request costs about what one request's call
    costs (the codec is launch-bound at streaming sizes). Layers use it through the same ``get`` /
    ``[key] =`` / ``in`` as the per-stream dict: ``get`` gathers the rows of the slots this call
    decodes (:meth:`select`, a device tensor), assignment scatters them back. A slot's rows start as
    zeros, which every layer treats exactly like "no state yet" (zero conv history, zero overlap
    tail, position 0, no valid window keys). Positions are state rows too, so a call never reads
    the device from the host and can be captured in a CUDA graph; ``max_positions`` bounds them
    (RoPE tables are built that long once, before any capture).
    """

    def __init__(self, max_slots: int, max_positions: int = 1 << 15) -> None:
        self.max_slots = max_slots
        self.max_positions = max_positions
        self.store: dict = {}
        self.rows: Tensor | None = None

    def select(self, rows: Tensor) -> None:
        """Decode the slots ``rows`` (int64 device tensor, distinct: the caller checks) next."""
        self.rows = rows

    def get(self, key: object, default: object = None) -> Tensor | None:
        t = self.store.get(key)
        return default if t is None else t.index_select(0, self.rows)

    def __contains__(self, key: object) -> bool:
        return key in self.store

    def __setitem__(self, key: object, value: Tensor) -> None:
        t = self.store.get(key)
        if t is None:
            t = self.store[key] = value.new_zeros(self.max_slots, *value.shape[1:])
        t.index_copy_(0, self.rows, value)

    def reset(self, slot: int) -> None:
        """Forget ``slot``'s stream: the next push on it starts a new one."""
        for t in self.store.values():
            t[slot].zero_()


State = dict | SlotState | None


class Snake(nn.Module):
    """``x + sin(alpha x)^2 / alpha`` per channel, on ``[B, C, T]`` or channels-last ``[B, C, 1, T]``."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.alpha = nn.Parameter(torch.ones(1, channels, 1))

    #: One fused pass (:mod:`ttsfleet.kernels.snake`) instead of the expression; set by the codec.
    fused = False
    #: With :attr:`fused`: the conv feeding this Snake runs without its bias and this pass adds it
    #: (:func:`run`; one pass over the conv's output fewer, issue #25). On: an H200 push of 64 x 4 took
    #: 17.1 ms with it against 18.3 without (NCL; 14.7 vs 15.7 channels-last; 1.01-1.08x from 1 x 1
    #: to 128 x 4, one process, 2026-12-04, benchmarks/inference_h200/2026-12-04/run8-*);
    #: CPU-checked equal through Triton's interpreter. :func:`set_fuse_bias` turns it off (A/B).
    fuse_bias = True

    def takes_bias(self) -> bool:
        """Whether :func:`run` hands this Snake the preceding conv's bias (see :attr:`fuse_bias`)."""
        return self.fused and self.fuse_bias

    def forward(self, x: Tensor, st: State = None, out: Tensor | None = None,
                bias: Tensor | None = None) -> Tensor:
        """``out`` (``x``'s shape, any strides): written in place and returned, e.g. the new-input
        part of the next causal conv's ``[history | new]`` buffer (:func:`run`). ``bias`` (``C``
        values): Snake of ``x + bias``, the producing conv's bias (:attr:`fuse_bias`)."""
        alpha = self.alpha if x.dim() == 3 else self.alpha.unsqueeze(-1)
        compiling = torch.compiler.is_compiling()
        if bias is not None and (compiling or not self.fused):  # only the kernel adds it in its pass
            x, bias = x + _per_channel(bias, x), None
        if self.fused and compiling:
            # Traced by torch.compile: the expression in float32 (as the kernel computes it), which
            # Inductor fuses with the ops around it; the hand-written kernel would be a fusion barrier.
            a = alpha.float()
            y = (x.float() + (a + 1e-9).reciprocal() * torch.sin(a * x.float()).pow(2)).to(x.dtype)
            return y if out is None else out.copy_(y)
        if self.fused:
            from ttsfleet.kernels.snake import snake

            return snake(x, self.alpha, out=out, bias=bias)
        if out is not None and (compiling or torch.is_grad_enabled()):
            # Dynamo breaks the graph on a strided ``out=`` (copy_ traces), autograd refuses ``out=``
            return out.copy_(x + (alpha + 1e-9).reciprocal() * torch.sin(alpha * x).pow(2))
        return torch.add(x, (alpha + 1e-9).reciprocal() * torch.sin(alpha * x).pow(2), out=out)


def _per_channel(v: Tensor, like: Tensor) -> Tensor:
    """``C`` per-channel values shaped to broadcast over ``like`` (``[B, C, T]`` or ``[B, C, 1, T]``)."""
    return v.view(1, -1, *[1] * (like.dim() - 2))


def _weight_4d(weight: Tensor, cached: Tensor | None) -> Tensor:
    """A conv's weight as ``[Co, Ci, 1, K]``: the channels-last copy :func:`cache_channels_last`
    made, or, when there is none or it is stale (the module moved since), a view converted per call
    (correct, slower)."""
    if cached is None or cached.device != weight.device or cached.dtype != weight.dtype:
        return weight.unsqueeze(2)
    return cached


def _channels_last_4d(t: Tensor) -> Tensor:
    """A conv weight ``[Co, Ci, K]`` as ``[Co, Ci, 1, K]`` in NHWC memory: the layout cuDNN's
    channels-last kernels read (an NCHW weight would be converted on every call)."""
    return t.detach().unsqueeze(2).contiguous(memory_format=torch.channels_last)


def _new_buffer(x: Tensor, length: int) -> Tensor:
    """An uninitialised ``x``-like tensor ``length`` samples long, in ``x``'s layout (3-D ``[B, C, T]``
    contiguous, or 4-D ``[B, C, 1, T]`` channels-last)."""
    if x.dim() == 3:
        return x.new_empty(x.shape[0], x.shape[1], length)
    return torch.empty(x.shape[0], x.shape[1], 1, length, dtype=x.dtype, device=x.device,
                       memory_format=torch.channels_last)


def _state_view(t: Tensor) -> Tensor:
    """What a layer stores as stream state: always 3-D ``[B, C, n]``, whatever the layout computing,
    so a stream's state does not depend on (or break when changing) the layout."""
    return t.squeeze(2) if t.dim() == 4 else t


def _as_layout_of(t: Tensor, x: Tensor) -> Tensor:
    """Stored 3-D state ``t`` shaped like ``x`` (``[B, C, 1, n]`` view when ``x`` is 4-D)."""
    return t.unsqueeze(2) if x.dim() == 4 else t


@contextlib.contextmanager
def _without_onednn() -> Iterator[None]:
    """torch's own CPU kernels instead of oneDNN's in the block: for strided bf16 convs on the CPU
    (:meth:`CausalConv._conv`).

    Why: on CPUs with AMX, oneDNN's bf16 brgemm convolutions return wrong numbers for some strided
    shapes (upstream: pytorch/pytorch#169688, "Stride 3 bfloat16 convolutions appear incorrect",
    open). Measured here (torch 2.13.0, a Xeon with ``amx_bf16``, 2026-12-05): 16 -> 32 channels at
    stride 4 (kernel 8, the encoders' downsampling) and stride 8 (kernel 16) came out 73-84 % off
    float32 (stride 2 and 3, or 32 -> 64 channels at stride 8: 0.25 %), so a bf16
    encode on such a CPU made codes 19 % equal to float32's instead of ~85 %; the same machine with
    ``ONEDNN_MAX_CPU_ISA=AVX512_CORE``, or torch's native conv, was right. A CPU bf16 codec is a
    test and smoke-run path (GPUs run the real work), so its strided convs give up oneDNN's speed."""
    was = torch.backends.mkldnn.enabled
    torch.backends.mkldnn.enabled = False
    try:
        yield
    finally:
        torch.backends.mkldnn.enabled = was


class CausalConv(nn.Module):
    """Left-padded conv (``k_eff - stride`` zeros, right-padded to whole output frames).

    Input ``[B, C, T]`` (a 1-D conv) or channels-last ``[B, C, 1, T]`` (the same numbers as a 2-D
    conv of height 1, which cuDNN runs with its faster NHWC kernels: issue #25). Stride-1 convs
    (every streaming one) take their input through a ``[history | new]`` buffer (:meth:`open` /
    :meth:`close`): the history (carried, or the reference's zeros one-shot) is copied into its
    head, so a producer can write the new samples straight into its tail instead of a
    ``torch.cat`` copying them (:func:`run` does that for Snake -> conv).
    """

    def __init__(self, cin: int, cout: int, kernel: int, dilation: int = 1, stride: int = 1,
                 groups: int = 1) -> None:
        super().__init__()
        self.conv = nn.Conv1d(cin, cout, kernel, stride=stride, dilation=dilation, groups=groups)
        self.stride = stride
        self.k_eff = (kernel - 1) * dilation + 1
        self.pad = self.k_eff - stride
        #: The weight as a channels-last 4-D tensor (:func:`cache_channels_last`); not a parameter.
        self.weight_4d: Tensor | None = None
        #: The weight as ``[K, Ci, Co]`` rows for the fused residual units (:func:`set_fused_units`).
        self.weight_rows: Tensor | None = None

    def _conv(self, x: Tensor, with_bias: bool = True) -> Tensor:
        """The conv of the padded input; ``with_bias=False``: without the bias (the parameter stays;
        the consumer adds it, :attr:`Snake.fuse_bias`)."""
        c = self.conv
        bias = c.bias if with_bias else None
        if x.device.type == "cpu" and x.dtype == torch.bfloat16 and self.stride > 1:
            with _without_onednn():  # never on a GPU (nor in a compiled graph)
                return self._conv_op(x, bias)
        return self._conv_op(x, bias)

    def _conv_op(self, x: Tensor, bias: Tensor | None) -> Tensor:
        c = self.conv
        if x.dim() == 3:
            return F.conv1d(x, c.weight, bias, c.stride, 0, c.dilation, c.groups)
        return F.conv2d(x, _weight_4d(c.weight, self.weight_4d), bias, (1, self.stride), 0,
                        (1, c.dilation[0]), c.groups)

    def open(self, x: Tensor, st: State = None) -> Tensor:
        """A ``[history | room for x's samples]`` buffer in ``x``'s layout, the history filled in."""
        buf = _new_buffer(x, self.pad + x.shape[-1])
        head = buf[..., : self.pad]
        hist = None if st is None else st.get(self)
        if hist is None:
            head.zero_()
        else:
            head.copy_(_as_layout_of(hist, x))
        return buf

    def close(self, buf: Tensor, st: State = None, with_bias: bool = True) -> Tensor:
        """Keep the buffer's last ``pad`` samples as the next call's history; convolve the buffer."""
        self.keep_history(buf, st)
        return self._conv(buf, with_bias)

    def keep_history(self, buf: Tensor, st: State = None) -> None:
        """Store the buffer's last ``pad`` samples as the stream's history for its next call."""
        if st is not None:
            st[self] = _state_view(buf[..., buf.shape[-1] - self.pad:])

    def rows_weight(self) -> Tensor:
        """The weight as ``[K, Ci, Co]`` GEMM operands (:func:`~ttsfleet.kernels.codec_conv.weight_rows`),
        the cached copy when :func:`set_fused_units` made one for the weight as it is now."""
        from ttsfleet.kernels.codec_conv import weight_rows

        w, cached = self.conv.weight, self.weight_rows
        if cached is None or cached.device != w.device or cached.dtype != w.dtype:
            return weight_rows(w)
        return cached

    def forward(self, x: Tensor, st: State = None, with_bias: bool = True) -> Tensor:
        if self.stride != 1:
            if st is not None:
                raise ValueError("streaming supports stride-1 convs only")
            length = x.shape[-1]
            n_frames = (length - self.k_eff + self.pad) / self.stride + 1
            extra = (math.ceil(n_frames) - 1) * self.stride + (self.k_eff - self.pad) - length
            return self._conv(F.pad(x, (self.pad, extra)), with_bias)
        if self.pad == 0:  # a 1x1 conv: no history, nothing to concatenate
            return self._conv(x, with_bias)
        buf = self.open(x, st)
        buf[..., self.pad:].copy_(x)
        return self.close(buf, st, with_bias)


class CausalTransConv(nn.Module):
    """Transposed conv whose last ``kernel - stride`` samples are cut (they await the next input)."""

    def __init__(self, cin: int, cout: int, kernel: int, stride: int) -> None:
        super().__init__()
        self.conv = nn.ConvTranspose1d(cin, cout, kernel, stride=stride)
        self.stride, self.kernel = stride, kernel
        self.weight_4d: Tensor | None = None

    def _conv_t(self, x: Tensor) -> Tensor:
        w = self.conv.weight
        if x.dim() == 3:
            return F.conv_transpose1d(x, w, None, stride=self.stride)
        return F.conv_transpose2d(x, _weight_4d(w, self.weight_4d), None, stride=(1, self.stride))

    def forward(self, x: Tensor, st: State = None) -> Tensor:
        ov = self.kernel - self.stride
        y = self._conv_t(x)
        if st is not None and ov > 0:
            tail = st.get(self)
            if tail is not None:  # the previous call's overlap, added in place (no concatenation)
                y[..., :ov] += _as_layout_of(tail, y)
            st[self] = _state_view(y[..., y.shape[-1] - ov:])
        y = y[..., : y.shape[-1] - ov]
        return y + _per_channel(self.conv.bias, y)


def cache_channels_last(module: nn.Module) -> None:
    """Give every causal (transposed) conv under ``module`` its channels-last 4-D weight, built from
    the current weight (call again after loading other weights or moving the module)."""
    for m in module.modules():
        if isinstance(m, (CausalConv, CausalTransConv)):
            m.weight_4d = _channels_last_4d(m.conv.weight)


def uncache_channels_last(module: nn.Module) -> None:
    for m in module.modules():
        if isinstance(m, (CausalConv, CausalTransConv)):
            m.weight_4d = None


def cached_conv_weights(module: nn.Module) -> Iterator[Tensor]:
    """The conv weights cached under ``module`` in another layout (:func:`cache_channels_last`'s 4-D
    weights, :func:`set_fused_units`' weight rows), each followed by the tensors it is a view of
    (a 1x1 conv's 4-D weight is a view of its detached weight).

    Why a list of them: they are plain tensor attributes, not parameters or buffers, so
    ``torch.compile(dynamic=True)`` traces their sizes as symbols unless they are marked static
    (:meth:`~ttsfleet.inference.codec.SlotCodecStream._compile` does)."""
    for m in module.modules():
        if isinstance(m, (CausalConv, CausalTransConv)):
            for t in (m.weight_4d, getattr(m, "weight_rows", None)):
                while t is not None:
                    yield t
                    t = t._base


class ResidualUnit(nn.Module):
    """``x + conv1x1(Snake(conv7(Snake(x))))``, the dilated conv causal with carried history."""

    #: Its two convs as Triton implicit GEMMs with the second Snake and the residual add in their
    #: epilogues (:func:`~ttsfleet.kernels.codec_conv.conv_rows`, issue #25): 6 passes over the
    #: unit's ``T x C`` tensor instead of 11. Channels-last input only, where the kernel dispatch runs
    #: Triton, and only for the units :meth:`takes_fused` admits; set per codec
    #: (:meth:`~ttsfleet.inference.codec.Codec.use_fused_units`).
    fused_convs = False
    #: The widest unit and the fewest rows (streams x samples) a call must have to run fused. Measured
    #: on an H100, one unit of a 64 x 4 push (2026-12-05, benchmarks/inference_h200/2026-12-05b/
    #: call1 codec_units): fused 0.75 vs cuDNN 1.05 ms at width 192 (262k rows), 0.92 vs 1.05 at 96
    #: (524k), but 0.39 vs 0.37 at 768 (8k rows) and 0.69 vs 0.68 at 384 (65k): the wide units are
    #: compute-bound, where cuDNN's convs are faster; a 1-stream x 1-frame push ran 2.61 instead of
    #: 2.18 ms fused throughout (few rows: few programs, each a long K loop).
    fused_max_width = 256
    fused_min_rows = 16384

    def takes_fused(self, x: Tensor) -> bool:
        """Whether a call on ``x`` runs fused: switched on, channels-last, narrow enough, enough rows,
        Triton running for its device (and not while torch.compile traces)."""
        return (self.fused_convs and x.dim() == 4 and x.shape[1] <= self.fused_max_width
                and x.shape[0] * x.shape[-1] >= self.fused_min_rows and not torch.compiler.is_compiling()
                and _triton_runs(x))

    def __init__(self, dim: int, dilation: int) -> None:
        super().__init__()
        self.block = nn.ModuleList([Snake(dim), CausalConv(dim, dim, 7, dilation=dilation), Snake(dim),
                                    CausalConv(dim, dim, 1)])

    def forward(self, x: Tensor, st: State = None) -> Tensor:
        if self.takes_fused(x):
            return self._fused(x, st)
        return x + run(self.block, x, st)

    def _fused(self, x: Tensor, st: State) -> Tensor:
        """The same unit through :func:`~ttsfleet.kernels.codec_conv.conv_rows`: the first Snake into
        the dilated conv's ``[history | new]`` buffer (as :func:`run` does), the conv with the second
        Snake on its accumulator, the 1x1 conv with the residual added on its accumulator."""
        from ttsfleet.kernels.codec_conv import conv_rows, rows

        snake1, conv7, snake2, conv1 = self.block
        buf = conv7.open(x, st)
        snake1(x, st, out=buf[..., conv7.pad:])
        conv7.keep_history(buf, st)
        h = _new_buffer(x, x.shape[-1])
        conv_rows(rows(buf), conv7.rows_weight(), conv7.conv.bias, out=rows(h),
                  dilation=conv7.conv.dilation[0], alpha=snake2.alpha)
        y = _new_buffer(x, x.shape[-1])
        conv_rows(rows(h), conv1.rows_weight(), conv1.conv.bias, out=rows(y), residual=rows(x))
        return y


def _triton_runs(x: Tensor) -> bool:
    """Whether the kernel dispatch runs the Triton kernels for ``x``'s device
    (:mod:`ttsfleet.kernels.dispatch`)."""
    from ttsfleet.kernels import dispatch

    return dispatch.use_triton(x)


def set_fused_units(module: nn.Module, on: bool = True) -> None:
    """:attr:`ResidualUnit.fused_convs` for every residual unit under ``module``; on gives each of
    their convs its ``[K, Ci, Co]`` weight rows (the fused GEMMs' operands, built from the current
    weight), off drops them."""
    from ttsfleet.kernels.codec_conv import weight_rows

    for unit in module.modules():
        if isinstance(unit, ResidualUnit):
            unit.fused_convs = on
            for m in unit.block:
                if isinstance(m, CausalConv):
                    m.weight_rows = weight_rows(m.conv.weight) if on else None


class ConvNeXt(nn.Module):
    """Causal depthwise conv → LayerNorm → MLP (GELU) → layer scale, residual."""

    def __init__(self, dim: int, mlp_ratio: float = 4.0) -> None:
        super().__init__()
        self.dwconv = CausalConv(dim, dim, 7, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pwconv1 = nn.Linear(dim, int(mlp_ratio * dim))
        self.pwconv2 = nn.Linear(int(mlp_ratio * dim), dim)
        self.gamma = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor, st: State = None) -> Tensor:
        y = self.dwconv(x, st).transpose(1, 2)
        y = self.pwconv2(F.gelu(self.pwconv1(self.norm(y))))
        return x + (self.gamma * y).transpose(1, 2)


class _LayerScale(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.gamma = nn.Parameter(torch.full((dim,), 1e-2))


class _Attn(nn.Module):
    def __init__(self, dim: int, n_head: int, head_dim: int) -> None:
        super().__init__()
        self.n_head, self.head_dim = n_head, head_dim
        self.wqkv = nn.Linear(dim, 3 * n_head * head_dim, bias=False)
        self.wo = nn.Linear(n_head * head_dim, dim, bias=False)


class _FFN(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)


class _TBlock(nn.Module):
    def __init__(self, dim: int, n_head: int, head_dim: int, hidden: int, eps: float) -> None:
        super().__init__()
        self.attention = _Attn(dim, n_head, head_dim)
        self.feed_forward = _FFN(dim, hidden)
        self.attention_norm = RMSNorm(dim, eps)
        self.ffn_norm = RMSNorm(dim, eps)
        self.attention_layer_scale = _LayerScale(dim)
        self.ffn_layer_scale = _LayerScale(dim)

    def qkv(self, x: Tensor, rope: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Queries and keys (RoPE applied) and values of ``x [b, t, dim]``, as ``[b, t, heads, hd]``."""
        a = self.attention
        b, t, _ = x.shape
        q, k, v = a.wqkv(self.attention_norm(x)).split(a.n_head * a.head_dim, dim=-1)
        q = apply_rope(q.view(b, t, a.n_head, a.head_dim), rope)
        k = apply_rope(k.view(b, t, a.n_head, a.head_dim), rope)
        return q, k, v.view(b, t, a.n_head, a.head_dim)

    def attend_and_mlp(self, x: Tensor, q: Tensor, k: Tensor, v: Tensor, mask: Tensor) -> Tensor:
        """The rest of the block once the keys are known: masked attention, then the SwiGLU FFN."""
        b, t, _ = x.shape
        y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                           attn_mask=mask)
        x = x + self.attention.wo(y.transpose(1, 2).reshape(b, t, -1)) * self.attention_layer_scale.gamma
        f = self.feed_forward
        hf = self.ffn_norm(x)
        return x + f.w2(F.silu(f.w1(hf)) * f.w3(hf)) * self.ffn_layer_scale.gamma


class WindowTransformer(nn.Module):
    """Causal transformer attending to the last ``window`` positions; channels-first in and out."""

    #: Whether :meth:`_enter` makes its ``[b, t, dim]`` input dense (see there); False: the old form.
    dense_input = True
    #: The attention backend of batched streaming pushes (:meth:`_forward_slots`): None, torch's
    #: choice, or one of :data:`SDPA_BACKENDS`. Why a knob: a push's few queries (4 per stream at
    #: 4 frames) against ~130 window keys ran cuDNN's SDPA kernel with 64-query tiles, 0.69 of a
    #: 64 x 4 push's 11.4 ms on an H100 for ~34 MB of keys and values (2026-12-05b call2 profile);
    #: benchmarks time the others side by side (``codec_compile.py`` ``+window-NAME`` variants).
    slot_sdpa: str | None = None

    def __init__(self, input_dim: int, dim: int, n_layer: int, n_head: int, head_dim: int, hidden: int,
                 eps: float, rope_base: float, block_size: int, window: int | None) -> None:
        super().__init__()
        self.layers = nn.ModuleList(_TBlock(dim, n_head, head_dim, hidden, eps) for _ in range(n_layer))
        self.norm = RMSNorm(dim, eps)
        self.input_proj = nn.Linear(input_dim, dim) if input_dim != dim else None
        self.output_proj = nn.Linear(dim, input_dim) if input_dim != dim else None
        self.window, self.rope_base, self.head_dim = window, rope_base, head_dim
        self.register_buffer("rope", rope_table(block_size, head_dim, rope_base), persistent=False)

    def _table(self, n: int) -> Tensor:
        if n > self.rope.shape[0]:  # the reference would fail past block_size; extend the same formula
            self.rope = rope_table(max(n, 2 * self.rope.shape[0]), self.head_dim, self.rope_base).to(
                self.rope.device)
        return self.rope

    def _enter(self, x: Tensor) -> Tensor:
        """Channels-first ``[b, c, t]`` in -> ``[b, t, dim]``, dense (a copy unless ``x`` is a
        transposed dense ``[b, t, c]`` already, as the channels-last encoder's is).

        Why dense (issue #25): elementwise ops keep their first input's strides, so a transposed view
        carried every norm's output, hence the ``wqkv`` / ``w1`` / ``w3`` GEMMs' input, as rows whose
        stride is the push's time length (4 for a 4-frame push): cuBLAS ran those 24 GEMMs of a
        decode push with an ``align2`` kernel, 3.3 of a 64 x 4 push's 15.6 ms on an H100
        (2026-12-05, benchmarks/inference_h200/2026-12-05b/call1-*). Dense, the push took 12.35
        instead of 15.50 ms, 128 x 4 22.62 instead of 28.80 (same H100, one process, call2-*). One
        copy of ``b x t x c`` values;
        :attr:`dense_input` False is the old form (benchmarks' side by side)."""
        x = x.transpose(1, 2)
        if self.dense_input:
            x = x.contiguous()
        return x if self.input_proj is None else self.input_proj(x)

    def _leave(self, x: Tensor) -> Tensor:
        """Final norm and projection back to ``[b, c, t]``."""
        x = self.norm(x)
        if self.output_proj is not None:
            x = self.output_proj(x)
        return x.transpose(1, 2)

    def forward(self, x: Tensor, st: State = None) -> Tensor:
        if x.dim() == 4:
            # Channels-last ``[B, C, 1, T]`` (the encoder's, :attr:`Encoder.channels_last`): its
            # ``[B, T, C]`` view is already dense, and the output's ``[B, C, T]`` view (a transposed
            # dense ``[B, T, C]``) is NHWC memory again once unsqueezed: no copy either way.
            return self.forward(x.squeeze(2), st).unsqueeze(2)
        if isinstance(st, SlotState):
            return self._forward_slots(x, st)
        x = self._enter(x)
        b, t, _ = x.shape
        p0 = 0 if st is None else st.get((self, "pos"), 0)
        pos = torch.arange(p0, p0 + t, device=x.device)
        rope = self._table(p0 + t)[pos][None]
        for layer in self.layers:
            q, k, v = layer.qkv(x, rope)
            kpos = pos
            if st is not None and (layer, "kv") in st:
                ck, cv, cpos = st[(layer, "kv")]
                k, v, kpos = torch.cat([ck, k], 1), torch.cat([cv, v], 1), torch.cat([cpos, pos])
            mask = kpos[None, :] <= pos[:, None]
            if self.window is not None:
                mask &= kpos[None, :] > pos[:, None] - self.window
            if st is not None:
                keep = k.shape[1] if self.window is None else min(k.shape[1], self.window - 1)
                n_keys = k.shape[1]
                st[(layer, "kv")] = (k[:, n_keys - keep:], v[:, n_keys - keep:], kpos[n_keys - keep:])
            x = layer.attend_and_mlp(x, q, k, v, mask[None, None])
        if st is not None:
            st[(self, "pos")] = p0 + t
        return self._leave(x)

    def _forward_slots(self, x: Tensor, st: SlotState) -> Tensor:
        """:meth:`forward` for many streams, each at its own position, with a fixed-size key window.

        Each row keeps the last ``window - 1`` keys (zeros before its stream starts, masked out by
        their negative positions), so shapes stay the same from the first push on and the rows
        attend to exactly the keys the per-stream path keeps.
        """
        if self.window is None:
            raise ValueError("batched streaming needs a windowed transformer")
        x = self._enter(x)
        b, t, _ = x.shape
        keep = self.window - 1
        p0 = st.get((self, "pos"))  # int64 [b]: positions already decoded per stream
        if p0 is None:
            p0 = torch.zeros(b, dtype=torch.int64, device=x.device)
        table = self._table(st.max_positions)
        pos = (p0[:, None] + torch.arange(t, device=x.device)).clamp(max=table.shape[0] - 1)  # [b, t]
        kpos = p0[:, None] - keep + torch.arange(keep + t, device=x.device)  # [b, keep + t]
        q_at, k_at = pos[:, :, None], kpos[:, None, :]
        mask = (k_at <= q_at) & (k_at > q_at - self.window) & (k_at >= 0)  # [b, t, keep + t]
        rope = table[pos]  # [b, t, D/2, 2]
        with _sdpa_backend(self.slot_sdpa):
            for layer in self.layers:
                q, k, v = layer.qkv(x, rope)
                ck, cv = st.get((layer, "k")), st.get((layer, "v"))
                if ck is None:
                    ck = k.new_zeros(b, keep, *k.shape[2:])
                    cv = torch.zeros_like(ck)
                k, v = torch.cat([ck, k], 1), torch.cat([cv, v], 1)
                st[(layer, "k")], st[(layer, "v")] = k[:, t:], v[:, t:]
                x = layer.attend_and_mlp(x, q, k, v, mask[:, None])
        st[(self, "pos")] = p0 + t
        return self._leave(x)


#: :attr:`WindowTransformer.slot_sdpa`'s choices: torch's SDPA backends (``SDPBackend`` members) by name.
SDPA_BACKENDS = {"cudnn": "CUDNN_ATTENTION", "efficient": "EFFICIENT_ATTENTION", "flash": "FLASH_ATTENTION",
                 "math": "MATH"}


def _sdpa_backend(name: str | None) -> contextlib.AbstractContextManager:
    """torch's SDPA restricted to the backend ``name`` in the block (None: torch's own choice)."""
    if name is None:
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    if name not in SDPA_BACKENDS:
        raise ValueError(f"window attention backend {name!r}: expected one of {', '.join(SDPA_BACKENDS)}")
    return sdpa_kernel(getattr(SDPBackend, SDPA_BACKENDS[name]))


def run(seq: nn.ModuleList, x: Tensor, st: State = None) -> Tensor:
    """Apply stream-aware modules in order (``nn.Tanh`` and other plain modules take no state).

    A Snake followed by a stride-1 causal conv with history writes its output straight into the
    conv's ``[history | new]`` buffer (:meth:`CausalConv.open`): the same numbers as running them
    one after the other, without the copy that concatenating history and input would make.

    A causal conv followed by a Snake that takes it (:meth:`Snake.takes_bias`) runs without its bias
    and the Snake adds it (``Snake(conv_nobias(x) + b)``): the conv's output is read once, not
    twice. Only the Snake's input changes form; every conv still convolves the same numbers and
    keeps the same history (the next conv's history is the Snake's output)."""
    i = 0
    bias = None  # the previous conv's bias, not yet added (only ever handed to a Snake)
    while i < len(seq):
        m = seq[i]
        nxt = seq[i + 1] if i + 1 < len(seq) else None
        if isinstance(m, Snake) and isinstance(nxt, CausalConv) and nxt.stride == 1 and nxt.pad > 0:
            pending = _deferred_bias(nxt, seq[i + 2] if i + 2 < len(seq) else None)
            buf = nxt.open(x, st)
            m(x, st, out=buf[..., nxt.pad:], bias=bias)
            x, bias = nxt.close(buf, st, with_bias=pending is None), pending
            i += 2
            continue
        if isinstance(m, Snake):
            x, bias = m(x, st, bias=bias), None
        elif isinstance(m, CausalConv):
            pending = _deferred_bias(m, nxt)
            x, bias = m(x, st, with_bias=pending is None), pending
        else:
            x = m(x, st) if isinstance(m, (CausalTransConv, ResidualUnit, ConvNeXt, WindowTransformer,
                                           SeqBlock)) else m(x)
        i += 1
    return x


def _deferred_bias(conv: CausalConv, consumer: nn.Module | None) -> Tensor | None:
    """``conv``'s bias when the module after it is a Snake that adds it (the conv then runs without
    it, :meth:`Snake.takes_bias`), else None (the conv adds its own)."""
    return conv.conv.bias if isinstance(consumer, Snake) and consumer.takes_bias() else None


class SeqBlock(nn.Module):
    """A named ``block`` list run in order (mirrors the reference's ``nn.Sequential`` key names)."""

    def __init__(self, modules: list[nn.Module]) -> None:
        super().__init__()
        self.block = nn.ModuleList(modules)

    def forward(self, x: Tensor, st: State = None) -> Tensor:
        return run(self.block, x, st)


def set_fuse_bias(module: nn.Module, on: bool = True) -> None:
    """:attr:`Snake.fuse_bias` for every Snake under ``module`` (A/B of the conv-bias fusion; it
    applies only to fused Snakes, :meth:`Snake.takes_bias`)."""
    for m in module.modules():
        if isinstance(m, Snake):
            m.fuse_bias = on
