"""The codec stage's encoder layout (``codecLayout``), its kernels and cuDNN autotuner defaults, the
shape bucketing that goes with the autotuner, and the encode benchmark's CPU smoke run (issue #25).

Channels-last is the same arithmetic in another order, so its codes are compared by agreement
(>= 99 %; on the tiny codec, CPU, every code was equal), not bit for bit.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from ttsfleet.fill_jobs.settings import CleaningConfig, load_config
from ttsfleet.fill_jobs.tokenize import (
    BatchEncoder,
    CodecStage,
    _autotuner,
    bucket_frames,
    code_agreement,
    default_autotune,
    default_units,
    pow2_parts,
)

from ttsfleet.errors import UserError

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks" / "fill_jobs" / "bench_codec_precision.py"
PINNED = "3fb0749dca2ace2c"  # the defaults' digest before codecPrecision and codecLayout existed


@pytest.fixture(autouse=True)
def _one_thread():
    # 2 shared cores: two torch threads beside other work ran these encodes 25x slower (measured)
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


def clips(lengths: tuple[int, ...] = (24000 + 17, 12345, 9001), rate: int = 24000) -> list[np.ndarray]:
    """Harmonics with a moving pitch and an on/off envelope (never zeros: they hide bugs)."""
    out = []
    for seed, n in enumerate(lengths):
        rng = np.random.default_rng(seed)
        t = np.arange(n) / rate
        phase = 2 * np.pi * np.cumsum(110 + 40 * np.sin(2 * np.pi * 0.7 * t + seed)) / rate
        x = sum(np.sin(k * phase) / k for k in range(1, 8)) * (0.5 + 0.5 * np.sin(2 * np.pi * 3 * t))
        out.append((0.2 * x + 0.01 * rng.standard_normal(n)).astype(np.float32))
    return out


def test_codec_layout_setting_reaches_the_encoder_and_keeps_old_digests(tmp_path: Path) -> None:
    good = tmp_path / "clean.yaml"
    good.write_text("codec: tiny\ncodecLayout: channels-last\n")
    cfg = load_config(good)
    enc = CodecStage(cfg, "cpu").encoder
    assert enc.layout == "channels-last" and enc.codec.encoder.channels_last
    assert not enc.codec.decoder.channels_last  # the decoder's layout is not the job's
    default = CodecStage(CleaningConfig(codec="tiny"), "cpu").encoder
    assert default.layout == "ncl" and not default.codec.encoder.channels_last
    assert CleaningConfig().digest() == CleaningConfig(codec_layout="ncl").digest() == PINNED
    assert CleaningConfig(codec_layout="channels-last").digest() != PINNED
    assert len({cfg.digest(), CleaningConfig(codec="tiny").digest(),
                CleaningConfig(codec="tiny", codec_layout="channels-last",
                               codec_precision="bf16").digest()}) == 3


def test_bad_codec_layout_is_one_readable_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("codec: tiny\ncodecLayout: nhwc\n")
    with pytest.raises(UserError, match="codecLayout: Input should be 'ncl' or 'channels-last'"):
        load_config(bad)
    with pytest.raises(UserError, match="codec layout 'nhwc' is not one of ncl, channels-last"):
        BatchEncoder("tiny", 24000, "cpu", 30.0, layout="nhwc")
    (tmp_path / "m.jsonl").write_text('{"audio": "a.wav", "text": "hi"}\n')
    proc = subprocess.run([sys.executable, "-P", "-m", "ttsfleet.cli", "fill", "run", "-i",
                           str(tmp_path / "m.jsonl"), "-o", str(tmp_path / "o"), "-c", str(tmp_path / "c"),
                           "--config", str(bad)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "codecLayout" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_channels_last_codes_agree_with_ncl() -> None:
    xs = clips()
    ncl = BatchEncoder("tiny", 24000, "cpu", 30.0)
    cl = BatchEncoder("tiny", 24000, "cpu", 30.0, layout="channels-last")
    assert not cl.fused and not cl.autotune and not cl.bucket_shapes  # CPU: neither applies
    a, b = ncl.encode(xs), cl.encode(xs)
    assert [x.shape for x in a] == [x.shape for x in b]
    assert code_agreement(a, b).overall >= 0.99
    b16 = BatchEncoder("tiny", 24000, "cpu", 30.0, precision="bf16", layout="channels-last")
    assert b16.codec.encoder.channels_last and b16.split
    ref16 = BatchEncoder("tiny", 24000, "cpu", 30.0, precision="bf16")
    assert code_agreement(ref16.encode(xs), b16.encode(xs)).overall >= 0.95  # bf16 rounds coarser


def test_cuda_defaults_fuse_and_autotune_only_off_the_bit_exact_path() -> None:
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert not default_autotune(cuda, "float32", "ncl")  # the default: today's heuristic kernels
    assert default_autotune(cuda, "float32", "channels-last")
    assert default_autotune(cuda, "bf16", "ncl") and default_autotune(cuda, "tf32", "ncl")
    assert not any(default_autotune(cpu, p, lay) for p in ("float32", "bf16")
                   for lay in ("ncl", "channels-last"))
    for precision, fused in (("float32", False), ("tf32", True), ("bf16", True)):
        enc = BatchEncoder("tiny", 24000, "cpu", 30.0, precision=precision)
        enc.device = cuda  # configure() only reads the device type: no GPU needed
        enc.configure("ncl")
        assert enc.fused is fused and enc.autotune is (precision != "float32")
        snakes = [m for m in enc.codec.encoder.modules() if type(m).__name__ == "Snake"]
        assert snakes and all(m.fused is fused for m in snakes)
        enc.configure("ncl", fused=False, autotune=False)  # explicit choices win
        assert not enc.fused and not enc.autotune and not enc.bucket_shapes


def test_fused_units_default_only_for_bf16_channels_last_on_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    """The residual units' fused convs: where the decoder's measured rule carries over (bf16, the
    channels-last rows they address, fused Snakes, CUDA), as ``TTSFLEET_CODEC_UNITS`` says."""
    from ttsfleet.inference.codec_batch import CODEC_UNITS_SWITCH

    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    monkeypatch.setattr(CODEC_UNITS_SWITCH, "_value", "fused")
    assert default_units(cuda, "bf16", "channels-last", True) == "fused"
    for args in ((cpu, "bf16", "channels-last", True), (cuda, "tf32", "channels-last", True),
                 (cuda, "float32", "channels-last", True), (cuda, "bf16", "ncl", True),
                 (cuda, "bf16", "channels-last", False)):
        assert default_units(*args) == "cudnn", args
    CODEC_UNITS_SWITCH.set("cudnn")
    assert default_units(cuda, "bf16", "channels-last", True) == "cudnn"
    monkeypatch.setenv("TTSFLEET_CODEC_UNITS", "triton")
    CODEC_UNITS_SWITCH.reset()
    with pytest.raises(UserError, match="TTSFLEET_CODEC_UNITS='triton': expected one of cudnn, fused"):
        default_units(cuda, "bf16", "channels-last", True)


def test_units_setting_reaches_the_encoders_residual_units() -> None:
    enc = BatchEncoder("tiny", 24000, "cpu", 30.0, precision="bf16", layout="channels-last")
    units = [m for m in enc.codec.encoder.modules() if type(m).__name__ == "ResidualUnit"]
    assert units and enc.units == "cudnn" and not any(u.fused_convs for u in units)  # CPU default
    enc.configure("channels-last", units="fused")
    assert enc.units == "fused" and all(u.fused_convs for u in units)
    assert enc.units_backend == "cudnn"  # the reference dispatch here: the units take cuDNN's path
    assert not any(u.fused_convs for u in enc.codec.decoder.modules() if type(u).__name__ == "ResidualUnit")
    with pytest.raises(UserError, match="codec units 'triton' is not one of cudnn, fused"):
        enc.configure("channels-last", units="triton")


def test_autotuner_switch_is_scoped_to_the_block() -> None:
    from ttsfleet.inference.codec_batch import CUDNN_CANDIDATES

    cudnn = torch.backends.cudnn
    saved = cudnn.benchmark, cudnn.benchmark_limit
    try:
        cudnn.benchmark, cudnn.benchmark_limit = False, 10
        with _autotuner(torch.device("cuda"), True):  # only sets the flags: no GPU needed
            assert cudnn.benchmark and cudnn.benchmark_limit == CUDNN_CANDIDATES
        assert not cudnn.benchmark and cudnn.benchmark_limit == 10
        with _autotuner(torch.device("cpu"), True), _autotuner(torch.device("cuda"), False):
            assert not cudnn.benchmark
    finally:
        cudnn.benchmark, cudnn.benchmark_limit = saved


def test_shape_buckets_pad_little_and_repeat() -> None:
    widths = range(1, 2000)
    buckets = {bucket_frames(f) for f in widths}
    for f in widths:
        b = bucket_frames(f)
        assert f <= b <= f * 9 / 8 + 1e-9 and bucket_frames(b) == b
    assert len(buckets) <= 8 + 8 * 8  # 1-8 exact, then eight per octave
    assert [len(p) for p in pow2_parts(list(range(13)))] == [8, 4, 1]
    assert sum(pow2_parts(list(range(13))), []) == list(range(13))
    assert pow2_parts([]) == [] and pow2_parts([5]) == [[5]]


def test_bucketed_batches_give_the_same_codes(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the autotuner, batches run in power-of-two parts padded to bucketed widths: the codec is
    causal and a clip's codes do not depend on its neighbours, so the codes stay the clips' own."""
    xs = clips((24000 + 17, 12345, 9001, 30000, 4097, 12000))  # 6 lengths: parts of 4 and 2
    plain = BatchEncoder("tiny", 24000, "cpu", 30.0)
    bucketed = BatchEncoder("tiny", 24000, "cpu", 30.0, autotune=True)
    assert bucketed.bucket_shapes and not plain.bucket_shapes
    shapes: list[tuple[int, int]] = []
    orig = bucketed.codec.encoder.forward

    def spy(x, channels_last=None):  # noqa: ANN001, ANN202
        shapes.append((x.shape[0], x.shape[-1] // bucketed.codec.frame_length))
        return orig(x, channels_last)

    monkeypatch.setattr(bucketed.codec.encoder, "forward", spy)
    a, b = plain.encode(xs), bucketed.encode(xs)
    assert [x.shape for x in a] == [x.shape for x in b]
    assert code_agreement(a, b).overall >= 0.99
    assert sum(n for n, _ in shapes) == len(xs) and len(shapes) >= 2
    assert all(n & (n - 1) == 0 and bucket_frames(w) == w for n, w in shapes)


def test_bench_cpu_smoke_prints_a_row_per_configuration(tmp_path: Path) -> None:
    out = tmp_path / "enc.json"
    proc = subprocess.run([sys.executable, "-P", str(BENCH), "run", "--device", "cpu", "--codec", "tiny",
                           "--threads", "1", "--clips", "2", "--clip-seconds", "1", "--repeats", "1",
                           "--precisions", "float32,bf16", "--snakes", "unfused,fused,fused-units",
                           "--out", str(out)],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(out.read_text())
    rows = result["rows"]
    got = [(r["precision"], r["layout"], r["snake"]) for r in rows]
    assert got == [(p, lay, s) for p in ("float32", "bf16") for lay in ("ncl", "channels-last")
                   for s in ("unfused", "fused", "fused-units") if s != "fused-units" or lay != "ncl"]
    assert {r["units_backend"] for r in rows} == {"cudnn"}  # the reference dispatch on the CPU
    assert result["date"] and result["machine"] and result["reference"]["layout"] == "ncl"
    ref = rows[0]
    assert ref["agreement_with_reference"]["overall"] == 1.0 and ref["speedup"] == 1.0
    assert all(r["audio_s_per_s"] > 0 and len(r["agreement_with_reference"]["per_codebook"]) == 10
               for r in rows)
    assert rows[-1]["agreement_with_reference"]["overall"] < 1.0  # bf16 moved some codes
    table = [line for line in proc.stdout.splitlines() if line.startswith("| ")]
    assert len(table) == 1 + len(rows)  # header + one row each
    assert sum("channels-last" in line for line in table) == 6
    assert sum("fused (reference)" in line for line in table) == 6  # CPU: the fused function's torch form
    report = subprocess.run([sys.executable, "-P", str(BENCH), "report", str(out), "--no-record"],
                            capture_output=True, text=True, timeout=60)
    assert report.returncode == 0 and "## codec encode" in report.stdout
    assert np.isfinite([r["median_pass_s"] for r in rows]).all()
