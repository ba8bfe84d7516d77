"""The codec stage: batched device resampling and encoding equal the codec's own one-clip path."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import numpy as np
import pytest
from scipy.signal import resample_poly
from ttsfleet.fill_jobs.runner import RunOptions, run_job
from ttsfleet.fill_jobs.settings import CleaningConfig, parse_stages
from ttsfleet.fill_jobs.tokenize import BatchEncoder, PolyphaseResampler, pack


def speechy(n: int, rate: int, seed: int) -> np.ndarray:
    """Harmonics with a moving pitch and an on/off envelope (never zeros: they hide bugs)."""
    rng = np.random.default_rng(seed)
    t = np.arange(n) / rate
    f0 = 110 + 40 * np.sin(2 * np.pi * 0.7 * t + seed)
    phase = 2 * np.pi * np.cumsum(f0) / rate
    x = sum(np.sin(k * phase) / k for k in range(1, 8)) * (0.5 + 0.5 * np.sin(2 * np.pi * 3 * t))
    return (0.2 * x + 0.01 * rng.standard_normal(n)).astype(np.float32)


def clips(rate: int = 24000) -> list[np.ndarray]:
    return [speechy(n, rate, i) for i, n in enumerate((rate * 2 + 17, 12345, rate, 3001, rate * 3 // 2))]


@pytest.mark.parametrize(("rin", "rout"), [(24000, 44100), (16000, 24000), (44100, 24000)])
def test_resampler_equals_scipy_resample_poly(rin: int, rout: int) -> None:
    import torch

    xs = clips(rin)
    rs = PolyphaseResampler(rin, rout)
    width = max(len(x) for x in xs)
    batch = torch.zeros(len(xs), width)
    for i, x in enumerate(xs):
        batch[i, : len(x)] = torch.from_numpy(x)
    y = rs(batch, [len(x) for x in xs]).numpy()
    for i, x in enumerate(xs):
        ref = resample_poly(x.astype(np.float64), rs.up, rs.down)
        assert rs.out_length(len(x)) == len(ref)
        np.testing.assert_allclose(y[i, : len(ref)], ref, atol=2e-5)
        assert not y[i, len(ref):].any()  # zero past the clip's end, as the codec pads


def test_pack_fits_the_budget_longest_first() -> None:
    lengths = [5, 9, 2, 9, 4]
    batches = pack(lengths, 20)
    assert sorted(i for b in batches for i in b) == list(range(5))
    assert batches[0] == [1, 3]  # longest first, ties by index
    assert all(len(b) * lengths[b[0]] <= 20 for b in batches)
    assert pack([30], 20) == [[0]]  # one clip over the budget still gets its own batch


def agreement(a: list[np.ndarray], b: list[np.ndarray]) -> float:
    assert [x.shape for x in a] == [x.shape for x in b]
    return float(np.mean(np.concatenate([(x == y).ravel() for x, y in zip(a, b, strict=True)])))


def test_batched_codes_equal_the_codecs_own_encode() -> None:
    enc = BatchEncoder("tiny", 24000, "cpu", batch_seconds=4.0)  # small budget: several batches
    xs = clips()
    got = enc.encode(xs)
    ref = [enc.codec.encode(x, 24000).numpy().astype(np.int16) for x in xs]
    assert got[0].shape[0] == enc.codec.num_codebooks == 10
    assert agreement(got, ref) >= 0.99
    alone = [enc.encode([x])[0] for x in xs]
    assert agreement(got, alone) >= 0.99  # batch neighbours and padding change (almost) nothing


@pytest.mark.gpu
def test_gpu_codes_equal_cpu_codes_within_tolerance() -> None:
    """Stated tolerance: >= 99 % of code entries equal (fp32, no TF32; a code flips only where
    two codebook entries are nearly equidistant)."""
    xs = clips()
    for preset in ("tiny", "s2-pro"):
        cpu = BatchEncoder(preset, 24000, "cpu", 30.0).encode(xs)
        gpu = BatchEncoder(preset, 24000, "cuda", 30.0).encode(xs)
        share = agreement(cpu, gpu)
        print(f"codec {preset}: {share:.4%} of codes equal on CPU and GPU")
        assert share >= 0.99, preset


@pytest.mark.audio
def test_codec_stage_stores_codes_with_each_output(clean_corpus: Path, tmp_path: Path) -> None:
    cfg = CleaningConfig(codec="tiny", workers=1, batch_items=3)
    opts = RunOptions(input=clean_corpus, output=tmp_path / "out", checkpoint=tmp_path / "ckpt",
                      stages=parse_stages("hash,codec"), checkpoint_every_items=2, interactive=False,
                      config=cfg)
    with contextlib.redirect_stderr(io.StringIO()):
        assert run_job(opts) == 0
    rows = [json.loads(line) for line in next((tmp_path / "out").glob("manifest.*.jsonl")).open()]
    assert rows and all(r["status"] == "accepted" for r in rows)
    for r in rows:
        (out,) = r["outputs"]
        codes = np.load(tmp_path / "out" / out["codes"])
        n44 = -(-round(out["seconds"] * cfg.target_rate) * 147 // 80)
        assert codes.dtype == np.int16 and codes.shape == (10, out["code_frames"])
        assert abs(codes.shape[1] - n44 / 2048) < 1.01  # seconds are rounded to 4 decimals
        assert codes[0].max() < 64 and codes[1:].max() < 16 and codes.min() >= 0  # tiny codebooks


def test_codec_stage_without_a_codec_is_a_user_error(tmp_path: Path) -> None:
    from ttsfleet.fill_jobs.tokenize import CodecStage

    from ttsfleet.errors import UserError

    with pytest.raises(UserError, match="codec stage needs a codec"):
        CodecStage(CleaningConfig())
