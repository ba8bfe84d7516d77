"""The codec stage: batched device resampling and encoding equal the codec's own one-clip path;
its lower precisions (``codecPrecision``) and the agreement measure."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import numpy as np
import pytest
from scipy.signal import resample_poly
from ttsfleet.fill_jobs.runner import RunOptions, run_job
from ttsfleet.fill_jobs.settings import CleaningConfig, load_config, parse_stages
from ttsfleet.fill_jobs.tokenize import (
    BatchEncoder,
    CodecStage,
    PolyphaseResampler,
    code_agreement,
    encode_split,
    pack,
    precision_agreement,
)

from ttsfleet.errors import UserError


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
    with pytest.raises(UserError, match="codec stage needs a codec"):
        CodecStage(CleaningConfig())


# --- codecPrecision --------------------------------------------------------------------------------
def codec_input(enc: BatchEncoder, xs: list[np.ndarray]):
    """What ``_encode_batch`` feeds the codec: resampled on the device, padded to whole frames."""
    import torch
    import torch.nn.functional as F

    host = torch.zeros(len(xs), max(len(x) for x in xs))
    for j, x in enumerate(xs):
        host[j, : len(x)] = torch.from_numpy(x)
    y = enc.resampler(host, [len(x) for x in xs])
    return F.pad(y, (0, -y.shape[-1] % enc.codec.frame_length))[:, None, :]


def test_float32_codes_are_bit_identical_to_the_codecs_own_path() -> None:
    import torch

    xs = clips()
    enc = BatchEncoder("tiny", 24000, "cpu", batch_seconds=30.0)  # one batch
    assert enc.precision == "float32" and not enc.split
    got = enc.encode(xs)
    x = codec_input(enc, xs)
    with torch.inference_mode():
        before = enc.codec.quantizer.encode(enc.codec.encoder(x))  # the stage's path before the setting
        split = encode_split(enc.codec, x, torch.float32)  # the mirror of Quantizer.encode
    assert torch.equal(split, before)
    for j, c in enumerate(got):
        np.testing.assert_array_equal(c, before[j, :, : c.shape[1]].numpy().astype(np.int16))
    ref = [enc.codec.encode(x, 24000).numpy().astype(np.int16) for x in xs]  # as the test above
    assert agreement(got, ref) >= 0.99
    cpu_tf32 = BatchEncoder("tiny", 24000, "cpu", 30.0, precision="tf32")  # TF32 is CUDA's: float32 here
    assert not cpu_tf32.split
    assert all(np.array_equal(a, b) for a, b in zip(cpu_tf32.encode(xs), got, strict=True))


def test_bf16_runs_the_trunk_in_bf16_and_the_codebooks_in_float32() -> None:
    import torch
    from ttsfleet.inference.codec import load_codec

    xs = clips()
    f32 = BatchEncoder("tiny", 24000, "cpu", 30.0)
    b16 = BatchEncoder("tiny", 24000, "cpu", 30.0, precision="bf16")
    assert b16.split and b16.trunk_dtype == torch.bfloat16
    ref16 = load_codec("tiny", dtype=torch.bfloat16)
    for a, b in zip(b16.codec.encoder.parameters(), ref16.encoder.parameters(), strict=True):
        assert a.dtype == torch.bfloat16 and torch.equal(a, b)  # the weights load_codec(dtype=bf16) has
    q16, q32 = b16.codec.quantizer, f32.codec.quantizer
    for a, b in zip(q16.semantic_quantizer.parameters(), q32.semantic_quantizer.parameters(), strict=True):
        assert a.dtype == torch.float32 and torch.equal(a, b)  # codebooks and projections untouched
    seen: dict[str, torch.dtype] = {}

    def dtype_of(name: str):
        def hook(module, args, out) -> None:  # returns None: the output is left as it is
            seen.setdefault(name, out.dtype)
        return hook

    hooks = [q16.pre_module.register_forward_hook(dtype_of("trunk")),
             q16.semantic_quantizer.quantizers[0].in_proj.register_forward_hook(dtype_of("search"))]
    got = b16.encode(xs)
    for h in hooks:
        h.remove()
    assert seen == {"trunk": torch.bfloat16, "search": torch.float32}
    ref = f32.encode(xs)
    for g, r in zip(got, ref, strict=True):
        assert g.dtype == np.int16 and g.shape == r.shape
        assert g.min() >= 0 and g[0].max() < 64 and g[1:].max() < 16  # tiny: 64 semantic, 16 residual
    measured = code_agreement(ref, got)
    assert 0.5 < measured.overall < 1.0  # bf16 changed some codes (random tiny weights: no more)
    assert precision_agreement(xs, 24000, "tiny", "cpu", "bf16", batch_seconds=30.0) == measured


def test_code_agreement_counts_identical_codes() -> None:
    rng = np.random.default_rng(0)
    a = [rng.integers(0, 16, (10, n)).astype(np.int16) for n in (7, 13)]
    same = code_agreement(a, [x.copy() for x in a])
    assert same.per_codebook == (1.0,) * 10 and same.overall == same.frames == 1.0 and same.codes == 200
    b = [x.copy() for x in a]
    b[1][3, 5] = (b[1][3, 5] + 1) % 16  # one code of codebook 3 flipped, in 20 frames, 200 codes
    one = code_agreement(a, b)
    assert one.per_codebook == (1.0,) * 3 + (19 / 20,) + (1.0,) * 6
    assert one.overall == 199 / 200 and one.frames == 19 / 20
    b[0][0, :] = (b[0][0, :] + 1) % 16  # the semantic codebook of the whole first clip
    two = code_agreement(a, b)
    assert two.per_codebook[0] == 13 / 20 and two.overall == 192 / 200 and two.frames == 12 / 20
    with pytest.raises(ValueError, match="cannot be compared"):
        code_agreement(a, [a[0], a[1][:, :-1]])


def test_tf32_switch_is_scoped_to_the_block() -> None:
    import torch
    from ttsfleet.fill_jobs.tokenize import _tf32

    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
        with _tf32(torch.device("cuda"), True):  # only sets the flags: no GPU needed
            assert torch.backends.cudnn.allow_tf32 and torch.backends.cuda.matmul.allow_tf32
        assert not torch.backends.cudnn.allow_tf32 and not torch.backends.cuda.matmul.allow_tf32
        with _tf32(torch.device("cpu"), True):
            assert not torch.backends.cuda.matmul.allow_tf32
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


def test_codec_precision_setting_reaches_the_encoder_and_bad_values_are_refused(tmp_path: Path) -> None:
    good = tmp_path / "clean.yaml"
    good.write_text("codec: tiny\ncodecPrecision: bf16\n")
    cfg = load_config(good)
    assert CodecStage(cfg, "cpu").encoder.precision == "bf16"
    assert CodecStage(CleaningConfig(codec="tiny"), "cpu").encoder.precision == "float32"
    pinned = "3fb0749dca2ace2c"  # the defaults' digest before the setting: older checkpoints resume
    assert CleaningConfig().digest() == CleaningConfig(codec_precision="float32").digest() == pinned
    assert len({cfg.digest(), CleaningConfig(codec="tiny").digest(),
                CleaningConfig(codec="tiny", codec_precision="tf32").digest()}) == 3
    bad = tmp_path / "bad.yaml"
    bad.write_text("codec: tiny\ncodecPrecision: fp16\n")
    with pytest.raises(UserError, match="codecPrecision: Input should be 'float32', 'tf32' or 'bf16'"):
        load_config(bad)
    with pytest.raises(UserError, match="codec precision 'fp16' is not one of float32, tf32, bf16"):
        BatchEncoder("tiny", 24000, "cpu", 30.0, precision="fp16")


@pytest.mark.gpu
def test_gpu_lower_precisions_run_and_leave_tf32_off() -> None:
    """tiny only (the S2-size figures: bench_codec_precision.py). No agreement threshold: random
    weights say nothing about the real codec's; printed for the record."""
    import torch

    xs = clips()
    ref = BatchEncoder("tiny", 24000, "cuda", 30.0).encode(xs)
    for precision in ("tf32", "bf16"):
        enc = BatchEncoder("tiny", 24000, "cuda", 30.0, precision)
        assert enc.split
        got = enc.encode(xs)
        assert not torch.backends.cuda.matmul.allow_tf32 and not torch.backends.cudnn.allow_tf32
        assert [g.shape for g in got] == [r.shape for r in ref]
        a = code_agreement(ref, got)
        print(f"codec tiny {precision}: {a.overall:.4%} of codes equal to float32's "
              f"(semantic {a.per_codebook[0]:.4%})")
