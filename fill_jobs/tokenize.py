"""The ``codec`` batch stage: every kept segment encoded into the model's codebook tokens.

The next DualAR training run reads ``[num_codebooks, frames]`` codes per segment, made by the
site's own codec (``codec: /models/codec.pth`` in the cleaning config; the random-weight presets
``tiny`` and ``s2-pro`` of :func:`ttsfleet.inference.codec.load_codec` in tests and benchmarks).
The codec's own ``encode`` takes one clip and resamples on the CPU with scipy; here a group's
clips are resampled to the codec's rate on the device (:class:`PolyphaseResampler`, the same
filter as ``scipy.signal.resample_poly``), zero-padded to one width and encoded in batches of
at most ``codecBatchSeconds`` of padded audio. The codec is causal end to end, so the padding
after a clip changes none of its frames: a clip's codes do not depend on its batch neighbours
(tests/fill_jobs/test_tokenize.py checks it against ``Codec.encode`` clip by clip).

Output per segment: ``codes/<2 hex>/<id>[.pNN].npy`` (int16, ``[num_codebooks, frames]``), named
in the row's output entry as ``codes`` with ``code_frames``.
"""

from __future__ import annotations

import io
from math import gcd
from typing import TYPE_CHECKING

import numpy as np

from ttsfleet.errors import UserError

if TYPE_CHECKING:
    import torch
    from ttsfleet.fill_jobs.settings import CleaningConfig


class PolyphaseResampler:
    """``scipy.signal.resample_poly(x, up, down)`` (Kaiser-windowed sinc, zero-extended ends) as
    one strided ``conv1d`` with a filter per output phase, on any torch device, batched."""

    def __init__(self, rate_in: int, rate_out: int, device: torch.device | str = "cpu") -> None:
        import torch
        from scipy.signal import firwin

        g = gcd(rate_in, rate_out)
        self.up, self.down = rate_out // g, rate_in // g
        up, down = self.up, self.down
        max_rate = max(up, down)
        half_len = 10 * max_rate
        h = firwin(2 * half_len + 1, 1.0 / max_rate, window=("kaiser", 5.0)) * up
        pre_pad = down - half_len % down
        hh = np.concatenate([np.zeros(pre_pad), h])
        remove = (half_len + pre_pad) // down
        taps = [(r + remove) * down for r in range(up)]  # out[q*up + r] reads hh[t_r - s*up]
        lo = min(-((len(hh) - 1 - t) // up) for t in taps)
        hi = max(t // up for t in taps)
        weight = np.zeros((up, 1, hi - lo + 1))
        for r, t in enumerate(taps):
            for k, s in enumerate(range(lo, hi + 1)):
                if 0 <= t - s * up < len(hh):
                    weight[r, 0, k] = hh[t - s * up]
        self.left = -lo  # input samples needed before x[0] (zeros)
        self.weight = torch.from_numpy(weight.astype(np.float32)).to(device)

    def out_length(self, n_in: int) -> int:
        return -(-n_in * self.up // self.down)

    def __call__(self, x: torch.Tensor, lengths: list[int]) -> torch.Tensor:
        """``x``: ``[B, N]`` zero-padded clips of ``lengths`` → ``[B, max out]``, zero past each end."""
        import torch
        import torch.nn.functional as F

        n_out = [self.out_length(n) for n in lengths]
        q = -(-max(n_out) // self.up)
        k = self.weight.shape[-1]
        need = (q - 1) * self.down + k
        xp = F.pad(x, (self.left, 0)) if self.left >= 0 else x[:, -self.left:]
        xp = F.pad(xp, (0, need - xp.shape[-1])) if xp.shape[-1] < need else xp[:, :need]
        y = F.conv1d(xp[:, None, :], self.weight, stride=self.down)  # [B, up, q]
        y = y.transpose(1, 2).reshape(x.shape[0], -1)[:, : max(n_out)]
        ends = torch.tensor(n_out, device=y.device)[:, None]
        return y * (torch.arange(y.shape[1], device=y.device)[None, :] < ends)


def pack(lengths: list[int], budget: int) -> list[list[int]]:
    """Indices of clips grouped into batches whose padded size (count x longest) fits ``budget``;
    longest first, deterministic for the same lengths."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    batches: list[list[int]] = []
    for i in order:
        if batches and (len(batches[-1]) + 1) * lengths[batches[-1][0]] <= budget:
            batches[-1].append(i)
        else:
            batches.append([i])
    return batches


class BatchEncoder:
    """A codec plus its resampler on one device: many clips at ``rate`` → codes per clip."""

    def __init__(self, codec_name: str, rate: int, device: str, batch_seconds: float) -> None:
        import torch
        from ttsfleet.inference.codec import load_codec

        self.device = torch.device(device)
        if self.device.type == "cuda":  # full fp32 (no TF32): codes are argmins over distances
            torch.backends.cudnn.allow_tf32 = False
            torch.backends.cuda.matmul.allow_tf32 = False
        self.codec = load_codec(codec_name, device=self.device)
        self.rate = rate
        self.resampler = PolyphaseResampler(rate, self.codec.sample_rate, self.device)
        self.budget = int(batch_seconds * rate)
        self.gpu_seconds = 0.0  # device time of the encode batches (CUDA events), GPU only

    def encode(self, clips: list[np.ndarray]) -> list[np.ndarray]:
        """int16 ``[num_codebooks, ceil(len_at_codec_rate / frame_length)]`` per clip."""
        out: list[np.ndarray | None] = [None] * len(clips)
        for batch in pack([len(c) for c in clips], self.budget):
            codes = self._encode_batch([clips[i] for i in batch])
            for i, c in zip(batch, codes, strict=True):
                out[i] = c
        return out  # type: ignore[return-value]

    def _encode_batch(self, clips: list[np.ndarray]) -> list[np.ndarray]:
        import torch
        import torch.nn.functional as F

        lengths = [len(c) for c in clips]
        host = torch.zeros(len(clips), max(lengths), dtype=torch.float32)
        for j, c in enumerate(clips):
            host[j, : len(c)] = torch.from_numpy(c)
        timed = self.device.type == "cuda"
        if timed:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        with torch.inference_mode():
            x = self.resampler(host.to(self.device, non_blocking=True), lengths)
            frame = self.codec.frame_length
            x = F.pad(x, (0, -x.shape[-1] % frame))[:, None, :]
            codes = self.codec.quantizer.encode(self.codec.encoder(x)).to(torch.int16)
        if timed:
            end.record()
        host_codes = codes.cpu().numpy()
        if timed:
            self.gpu_seconds += start.elapsed_time(end) / 1000
        frames = [-(-self.resampler.out_length(n) // frame) for n in lengths]
        return [np.ascontiguousarray(host_codes[j, :, :t]) for j, t in enumerate(frames)]


class CodecStage:
    """The ``codec`` batch stage (built by the registry as ``CodecStage(config, device)``)."""

    def __init__(self, config: CleaningConfig, device: str | None = None) -> None:
        from ttsfleet.fill_jobs.features import pick_device

        if not config.codec:
            raise UserError("the codec stage needs a codec: set codec: /path/to/codec.pth in "
                            "--config (or a preset: tiny, s2-pro)")
        self.encoder = BatchEncoder(config.codec, config.target_rate,
                                    device or pick_device(config.feature_device),
                                    config.codec_batch_seconds)

    @property
    def gpu_seconds(self) -> float:
        return self.encoder.gpu_seconds

    def process(self, results: list) -> None:
        from ttsfleet.fill_jobs.pipeline import audio_name

        todo = [(r, k) for r in results if r.accepted for k in range(len(r.clips))]
        if not todo:
            return
        codes = self.encoder.encode([r.clips[k] for r, k in todo])
        for (r, k), c in zip(todo, codes, strict=True):
            name = audio_name(r.key, k + 1, len(r.clips), ext="npy", folder="codes")
            buf = io.BytesIO()
            np.save(buf, c)
            r.files.append((name, buf.getvalue()))
            r.row["outputs"][k]["codes"] = name
            r.row["outputs"][k]["code_frames"] = int(c.shape[1])
