"""The optional GPU stage: log-mel features, checked against an independent numpy computation."""

from __future__ import annotations

import json

import numpy as np
import pytest
from ttsfleet.fill_jobs.features import LogMel, mel_filterbank
from ttsfleet.fill_jobs.settings import CleaningConfig

CFG = CleaningConfig(target_rate=16000, n_fft=512, hop_length=160, n_mels=40, feature_batch_size=4)


def numpy_logmel(x: np.ndarray, cfg: CleaningConfig) -> np.ndarray:
    """Reference: reflect-padded frames, periodic Hann window, float64 FFT."""
    half = cfg.n_fft // 2
    xp = np.pad(x.astype(np.float64), half, mode="reflect")
    n = 1 + (len(xp) - cfg.n_fft) // cfg.hop_length
    frames = np.stack([xp[i * cfg.hop_length: i * cfg.hop_length + cfg.n_fft] for i in range(n)])
    window = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(cfg.n_fft) / cfg.n_fft)
    power = np.abs(np.fft.rfft(frames * window, axis=1)) ** 2
    fb = mel_filterbank(cfg.target_rate, cfg.n_fft, cfg.n_mels).astype(np.float64)
    return np.log(np.maximum(fb @ power.T, 1e-10))


def clips() -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    t = np.arange(16000) / 16000
    return [(0.3 * np.sin(2 * np.pi * 440 * t[:12345])).astype(np.float32),
            (0.1 * rng.standard_normal(8000)).astype(np.float32),
            (0.2 * np.sin(2 * np.pi * 3000 * t)).astype(np.float32),
            (0.05 * rng.standard_normal(4321)).astype(np.float32),
            (0.5 * np.sin(2 * np.pi * 150 * t[:20000 % 16000])).astype(np.float32)]


def test_filterbank_peaks_at_the_tone() -> None:
    fb = mel_filterbank(16000, 512, 40)
    bins = np.linspace(0, 8000, 257)
    centers = bins[np.argmax(fb, axis=1)]
    assert np.all(np.diff(centers) >= 0)  # filters ordered by frequency
    for f in (300.0, 1000.0, 4000.0):
        tone_bin = int(round(f / 8000 * 256))
        assert abs(centers[np.argmax(fb[:, tone_bin])] - f) < 0.15 * f


def test_cpu_logmel_matches_numpy_reference() -> None:
    feats = LogMel(CFG, device="cpu")(clips())
    for x, f in zip(clips(), feats, strict=True):
        ref = numpy_logmel(x, CFG)
        assert f.shape == ref.shape == (CFG.n_mels, 1 + len(x) // CFG.hop_length)
        loud = ref > np.log(1e-6)
        np.testing.assert_allclose(f[loud], ref[loud], atol=2e-3)


def test_features_do_not_depend_on_batch_neighbours() -> None:
    together = LogMel(CFG, device="cpu")(clips())
    alone = [LogMel(CFG, device="cpu")([x])[0] for x in clips()]
    for a, b in zip(together, alone, strict=True):
        np.testing.assert_allclose(a, b, atol=1e-4)


@pytest.mark.gpu
def test_gpu_equals_cpu_within_tolerance() -> None:
    cpu = LogMel(CFG, device="cpu")(clips())
    gpu = LogMel(CFG, device="cuda")(clips())
    for a, b in zip(cpu, gpu, strict=True):
        loud = a > np.log(1e-6)
        np.testing.assert_allclose(b[loud], a[loud], atol=1e-3)


@pytest.mark.audio
def test_features_stage_writes_npy_per_output(cli, clean_corpus, dirs) -> None:
    proc = cli.run(clean_corpus, dirs, "--stages", "decode,features", "--checkpoint-every-items", "3")
    assert proc.returncode == 0, proc.stderr
    rows = [json.loads(line) for line in next(dirs.output.glob("manifest.*.jsonl")).read_text().splitlines()]
    cfg = CleaningConfig()
    for r in rows:
        (out,) = r["outputs"]
        f = np.load(dirs.output / out["features"])
        assert f.shape == (cfg.n_mels, 1 + round(out["seconds"] * cfg.target_rate) // cfg.hop_length)
        assert np.isfinite(f).all()
