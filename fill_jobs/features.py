"""The optional GPU stage: batched log-mel features with torch (CUDA when present, else CPU).

A commit's accepted clips are padded into batches of ``featureBatchSize``; each clip is
reflect-padded on its own before batching and its frames are cropped back afterwards, so a clip's
features do not depend on its batch neighbours. The same code runs on CPU and GPU (equal within
float tolerance; see tests/fill_jobs/test_features.py). Output: one float32 ``.npy`` per audio
file, shape ``(n_mels, frames)``, next to it under ``features/``.
"""

from __future__ import annotations

import io
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # only the thresholds' attributes are used: the GPU check runs without pydantic
    from ttsfleet.fill_jobs.settings import CleaningConfig


def mel_filterbank(rate: int, n_fft: int, n_mels: int, fmin: float = 0.0,
                   fmax: float | None = None) -> np.ndarray:
    """Triangular mel filters (HTK mel scale, area-normalized), shape ``(n_mels, n_fft//2+1)``."""
    fmax = fmax or rate / 2

    def hz_to_mel(f: np.ndarray | float) -> np.ndarray:
        return 2595.0 * np.log10(1.0 + np.asarray(f) / 700.0)

    def mel_to_hz(m: np.ndarray) -> np.ndarray:
        return 700.0 * (10 ** (m / 2595.0) - 1.0)

    hz = mel_to_hz(np.linspace(hz_to_mel(fmin), hz_to_mel(fmax), n_mels + 2))
    bins = np.linspace(0, rate / 2, n_fft // 2 + 1)
    lower, center, upper = hz[:-2, None], hz[1:-1, None], hz[2:, None]
    up = (bins[None, :] - lower) / (center - lower)
    down = (upper - bins[None, :]) / (upper - center)
    fb = np.maximum(0.0, np.minimum(up, down))
    return (fb * (2.0 / (upper - lower))).astype(np.float32)


def pick_device(name: str = "auto") -> str:
    import torch

    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return name


class LogMel:
    """Batched log-mel extractor bound to one device."""

    def __init__(self, config: CleaningConfig, device: str | None = None) -> None:
        import torch

        self.config = config
        self.rate = config.target_rate
        self.device = torch.device(device or pick_device(config.feature_device))
        self.window = torch.hann_window(config.n_fft, device=self.device)
        self.fb = torch.from_numpy(mel_filterbank(self.rate, config.n_fft, config.n_mels)).to(self.device)

    def __call__(self, clips: list[np.ndarray]) -> list[np.ndarray]:
        """Log-mel of each clip, ``(n_mels, 1 + len // hop)`` float32 on the host."""
        import torch

        cfg = self.config
        half = cfg.n_fft // 2
        out: list[np.ndarray] = []
        for i in range(0, len(clips), cfg.feature_batch_size):
            batch = clips[i: i + cfg.feature_batch_size]
            padded = [np.pad(c, half, mode="reflect" if len(c) > half else "constant") for c in batch]
            width = max(len(p) for p in padded)
            x = torch.zeros(len(batch), width, device=self.device)
            for j, p in enumerate(padded):
                x[j, : len(p)] = torch.from_numpy(np.ascontiguousarray(p, np.float32)).to(self.device)
            with torch.no_grad():
                spec = torch.stft(x, cfg.n_fft, cfg.hop_length, window=self.window, center=False,
                                  return_complex=True).abs().pow(2)
                mel = torch.log(torch.clamp(torch.matmul(self.fb, spec), min=1e-10))
            host = mel.float().cpu().numpy()
            for j, c in enumerate(batch):
                out.append(np.ascontiguousarray(host[j, :, : 1 + len(c) // cfg.hop_length]))
        return out



class LogMelStage:
    """The ``features`` batch stage: one ``.npy`` log-mel per output, named in the row."""

    def __init__(self, config: CleaningConfig, device: str | None = None) -> None:
        self.logmel = LogMel(config, device)

    def process(self, results: list) -> None:
        from ttsfleet.fill_jobs.pipeline import audio_name

        todo = [(r, k) for r in results if r.accepted for k in range(len(r.clips))]
        feats = self.logmel([r.clips[k] for r, k in todo])
        for (r, k), f in zip(todo, feats, strict=True):
            name = audio_name(r.key, k + 1, len(r.clips), ext="npy")
            buf = io.BytesIO()
            np.save(buf, f)
            r.files.append((name, buf.getvalue()))
            r.row["outputs"][k]["features"] = name
