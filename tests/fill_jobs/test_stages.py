"""Each cleaning stage on real espeak-ng speech where the right answer is known."""

from __future__ import annotations

import itertools
import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from ttsfleet.fill_jobs import quality, reasons
from ttsfleet.fill_jobs.audio_io import AudioRejected, decode, resample
from ttsfleet.fill_jobs.corpus import ESPEAK_RATE, add_noise, add_silence, clip
from ttsfleet.fill_jobs.dedup import DedupIndex, distance, fingerprint
from ttsfleet.fill_jobs.loudness import limit_peaks, measure_lufs, normalize
from ttsfleet.fill_jobs.settings import CleaningConfig
from ttsfleet.fill_jobs.vad import split_at_pauses

pytestmark = pytest.mark.audio


def speech(corpus: Path, i: int) -> np.ndarray:
    return sf.read(corpus.parent / "wav" / f"utt-{i:05d}.wav", dtype="float32")[0]


@pytest.fixture(scope="module")
def vad():
    from ttsfleet.fill_jobs.vad import SileroVad

    return SileroVad(CleaningConfig())


# --- decode -----------------------------------------------------------------------------------

def _ffmpeg(src: Path, dst: Path, *args: str) -> Path:
    subprocess.run(["ffmpeg", "-v", "error", "-y", "-i", str(src), *args, str(dst)], check=True,
                   timeout=60)
    return dst


def test_decode_common_formats(tmp_path: Path, clean_corpus: Path) -> None:
    x = speech(clean_corpus, 0)
    wav = clean_corpus.parent / "wav" / "utt-00000.wav"
    sf.write(tmp_path / "a.flac", x, ESPEAK_RATE)
    sf.write(tmp_path / "stereo.wav", np.stack([x, x], axis=1), ESPEAK_RATE)
    files = {"flac": tmp_path / "a.flac", "stereo": tmp_path / "stereo.wav",
             "mp3": _ffmpeg(wav, tmp_path / "a.mp3", "-b:a", "64k"),
             "ogg": _ffmpeg(wav, tmp_path / "a.ogg", "-c:a", "libvorbis"),
             "opus": _ffmpeg(wav, tmp_path / "a.opus", "-c:a", "libopus"),
             "m4a (ffmpeg fallback)": _ffmpeg(wav, tmp_path / "a.m4a")}
    ref_level = 10 * np.log10(np.mean(x.astype(np.float64) ** 2))
    for name, path in files.items():
        y, rate = decode(str(path))
        assert y.ndim == 1 and y.dtype == np.float32, name
        assert abs(len(y) / rate - len(x) / ESPEAK_RATE) < 0.06, name
        level = 10 * np.log10(np.mean(resample(y, rate, ESPEAK_RATE).astype(np.float64) ** 2))
        assert abs(level - ref_level) < 1.0, name
    y, _ = decode(str(files["flac"]))
    np.testing.assert_allclose(y, x, atol=1 / 32768)


def test_decode_failures_are_reasons(tmp_path: Path) -> None:
    (tmp_path / "junk.wav").write_bytes(b"RIFF....WAVEfmt " + bytes(500))
    (tmp_path / "text.mp3").write_text("not audio at all")
    cases = {str(tmp_path / "nope.wav"): reasons.MISSING_FILE,
             str(tmp_path / "junk.wav"): reasons.UNREADABLE,
             str(tmp_path / "text.mp3"): reasons.UNREADABLE}
    for path, reason in cases.items():
        with pytest.raises(AudioRejected) as err:
            decode(path)
        assert err.value.reason == reason


def test_resample_keeps_pitch_and_duration() -> None:
    t = np.arange(ESPEAK_RATE) / ESPEAK_RATE
    y = resample(np.sin(2 * np.pi * 440 * t).astype(np.float32), ESPEAK_RATE, 24000)
    assert len(y) == 24000
    spectrum = np.abs(np.fft.rfft(y))
    assert abs(np.argmax(spectrum) * 24000 / len(y) - 440) <= 1


# --- VAD: trimming and splitting -------------------------------------------------------------

@pytest.mark.parametrize("lead, trail", [(0.0, 0.0), (0.7, 1.3), (2.0, 0.4)])
def test_trim_within_50ms_of_inserted_silence(vad, clean_corpus: Path, lead: float, trail: float) -> None:
    from ttsfleet.fill_jobs.vad import trim_bounds

    x = speech(clean_corpus, 1)
    voiced = np.flatnonzero(np.abs(x) > 1e-3)
    onset, offset = voiced[0] / ESPEAK_RATE, (voiced[-1] + 1) / ESPEAK_RATE
    y = resample(add_silence(x, ESPEAK_RATE, lead, trail), ESPEAK_RATE, 24000)
    start, end = trim_bounds(y, 24000, vad.speech_regions(y, 24000), pad_ms=20)
    assert abs(start / 24000 - (lead + onset)) <= 0.05
    assert abs(end / 24000 - (lead + offset)) <= 0.05


def test_silence_has_no_speech(vad) -> None:
    rng = np.random.default_rng(0)
    assert vad.speech_regions(np.zeros(48000, np.float32), 24000) == []
    assert vad.speech_regions((1e-3 * rng.standard_normal(48000)).astype(np.float32), 24000) == []


def test_split_at_pauses_cuts_in_the_middle_of_gaps() -> None:
    regions = [(0, 80), (100, 180), (200, 290), (310, 390)]
    pieces = split_at_pauses((0, 390), regions, max_len=200)
    assert pieces == [(0, 190), (190, 390)]
    assert split_at_pauses((0, 390), regions, max_len=400) == [(0, 390)]
    assert split_at_pauses((0, 390), [(0, 390)], max_len=200) is None


def test_long_recording_split_at_inserted_pauses(mixed_reference, mixed_corpus) -> None:
    rows = {r["id"]: r for r in _rows(mixed_reference.output)}
    outs = rows["split"]["outputs"]
    assert len(outs) >= 2 and all(o["seconds"] <= 15.0 for o in outs)
    # The corpus joins two utterances e, f as [e, pause, f, pause] * 3 with 0.6 s pauses.
    manifest, _ = mixed_corpus
    srcs = sorted((manifest.parent / "wav").glob("src-*.wav"))[-2:]
    e, f = (sf.info(p).duration for p in srcs)
    pauses, t = [], 0.0
    for seconds in [e, f] * 3:
        t += seconds
        pauses.append((t, t + 0.6))
        t += 0.6
    for cut in (o["end"] for o in outs[:-1]):
        assert any(a - 0.05 <= cut <= b + 0.05 for a, b in pauses), (cut, pauses)


# --- loudness ------------------------------------------------------------------------------------

@pytest.mark.parametrize("target", [-30.0, -23.0, -16.0])
def test_loudness_within_half_lu_and_peaks_limited(clean_corpus: Path, target: float) -> None:
    x = 0.2 * speech(clean_corpus, 2)
    y, before, after = normalize(x, ESPEAK_RATE, target, ceiling_dbfs=-1.0)
    assert abs(measure_lufs(y, ESPEAK_RATE) - target) <= 0.5
    assert np.max(np.abs(y)) <= 10 ** (-1.0 / 20) + 1e-6
    assert before < -30 and after == pytest.approx(measure_lufs(y, ESPEAK_RATE))


def test_limiter_caps_peaks_and_keeps_quiet_parts(clean_corpus: Path) -> None:
    x = 3.0 * speech(clean_corpus, 3)
    y = limit_peaks(x, ESPEAK_RATE, -3.0)
    assert np.max(np.abs(y)) <= 10 ** (-3 / 20) + 1e-6
    quiet = np.abs(x) < 0.05
    np.testing.assert_allclose(y[quiet], x[quiet], atol=0.05)


# --- quality measures ---------------------------------------------------------------------------

@pytest.mark.parametrize("snr", [5.0, 15.0, 30.0])
def test_snr_estimate_close_to_added_noise(vad, clean_corpus: Path, snr: float) -> None:
    x = add_noise(speech(clean_corpus, 4), snr, seed=1)
    est = quality.estimate_snr_db(x, ESPEAK_RATE, vad.speech_regions(x, ESPEAK_RATE))
    assert abs(est - snr) <= 3.0


def test_clipping_ratio_and_speech_rate(clean_corpus: Path) -> None:
    x = speech(clean_corpus, 5)
    assert quality.clipping_ratio(x) == 0.0
    clipped = clip(x, 10.0)
    assert quality.clipping_ratio(clipped) == pytest.approx(np.mean(np.abs(10 * x) >= 0.99))
    assert quality.clipping_ratio(clipped) > 0.05
    assert quality.chars_per_second("abc de!", 2.5) == pytest.approx(2.0)


# --- duplicates -----------------------------------------------------------------------------------

def test_fingerprint_separates_utterances_and_matches_copies(tmp_path: Path, clean_corpus: Path) -> None:
    xs = [speech(clean_corpus, i) for i in range(6)]
    fps = [fingerprint(x, ESPEAK_RATE) for x in xs]
    assert min(distance(a, b) for a, b in itertools.combinations(fps, 2)) > 0.35
    wav = clean_corpus.parent / "wav" / "utt-00000.wav"
    mp3, rate = decode(str(_ffmpeg(wav, tmp_path / "a.mp3", "-b:a", "48k")))
    variants = [0.3 * xs[0], add_noise(xs[0], 25, seed=2), resample(mp3, rate, ESPEAK_RATE)]
    for v in variants:
        assert distance(fingerprint(v, ESPEAK_RATE), fps[0]) <= 0.2


def test_dedup_index_keeps_first_occurrence(clean_corpus: Path) -> None:
    x = speech(clean_corpus, 0)
    idx = DedupIndex()
    idx.add("first", "h1", fingerprint(x, ESPEAK_RATE), 3.0)
    idx.add("second", "h1", fingerprint(0.5 * x, ESPEAK_RATE), 3.0)
    assert idx.exact("h1") == "first"
    assert idx.near(fingerprint(0.8 * x, ESPEAK_RATE), 3.1) == "first"
    assert idx.near(fingerprint(0.8 * x, ESPEAK_RATE), 5.0) is None  # duration too different
    assert idx.near(fingerprint(speech(clean_corpus, 1), ESPEAK_RATE), 3.0) is None


# --- the whole default pipeline on the mixed corpus ---------------------------------------------

def _rows(out: Path) -> list[dict]:
    return [json.loads(line) for p in sorted(out.glob("manifest.*.jsonl"))
            for line in p.read_text().splitlines()]


def test_mixed_corpus_verdicts(mixed_reference, mixed_corpus) -> None:
    _, expected = mixed_corpus
    rows = _rows(mixed_reference.output)
    assert sorted(r["id"] for r in rows) == sorted(expected)
    got = {r["id"]: r["reason"] for r in rows}
    assert got == expected
    by_id = {r["id"]: r for r in rows}
    assert by_id["dup-exact"]["duplicate_of"] == "src-00000"
    assert by_id["dup-near"]["duplicate_of"] == "src-00001"
    cfg = CleaningConfig()
    for r in rows:
        if r["status"] == "rejected":
            assert r["outputs"] == [] and r["detail"]
            continue
        assert abs(r["metrics"]["loudness_out_lufs"] - cfg.target_lufs) <= 0.5
        for o in r["outputs"]:
            y, rate = sf.read(mixed_reference.output / o["audio"], dtype="float32")
            assert rate == cfg.target_rate
            assert abs(len(y) / rate - o["seconds"]) < 1e-3
            assert np.max(np.abs(y)) <= 10 ** (cfg.peak_dbfs / 20) + 1e-3
    summary = json.loads(next(mixed_reference.output.glob("summary.*.json")).read_text())
    assert summary["accepted"] == sum(v is None for v in expected.values())
    assert sum(summary["rejected"].values()) == sum(v is not None for v in expected.values())
    # Every file under audio/ belongs to exactly one accepted row.
    listed = sorted(o["audio"] for r in rows for o in r["outputs"])
    on_disk = sorted(str(p.relative_to(mixed_reference.output))
                     for p in (mixed_reference.output / "audio").rglob("*.flac"))
    assert listed == on_disk
    padded = by_id["padded"]["metrics"]
    assert 1.5 <= padded["trim_start"] <= 1.6


def test_decode_over_http(clean_corpus: Path) -> None:
    import functools
    import http.server
    import threading

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

    handler = functools.partial(Quiet, directory=str(clean_corpus.parent))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}"
        y, rate = decode(f"{base}/wav/utt-00000.wav")
        np.testing.assert_array_equal(y, speech(clean_corpus, 0))
        with pytest.raises(AudioRejected) as err:
            decode(f"{base}/wav/nope.wav")
        assert err.value.reason == reasons.FETCH_ERROR
    finally:
        server.shutdown()
