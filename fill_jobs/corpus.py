"""Small speech corpora synthesized with Debian's ``espeak-ng`` (real speech, no downloads).

:func:`make_corpus` writes clean utterances and their JSONL manifest; other components' tests
(Slurm, operator) and the benchmarks use it. :func:`make_mixed_corpus` adds the faulty variants
the cleaning stages must catch (silence, noise, clipping, duplicates, corrupt and missing files,
transcripts that do not fit the audio) and returns what each item's verdict should be.
The signal helpers (:func:`add_silence`, :func:`add_noise`, ...) are plain numpy functions.
"""

from __future__ import annotations

import json
import random
import shutil
import subprocess
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ttsfleet.errors import UserError

ESPEAK_RATE = 22050  # espeak-ng's native output rate

_WORDS = (
    "river", "morning", "garden", "silver", "window", "market", "yellow", "engine", "quiet",
    "forest", "harbor", "candle", "violin", "mountain", "pocket", "letter", "summer", "winter",
    "basket", "planet", "orange", "thunder", "meadow", "bridge", "copper", "lantern", "island",
    "shadow", "rabbit", "pencil", "castle", "travel", "simple", "gentle", "bright", "narrow",
    "distant", "careful", "golden", "hollow", "ancient", "modern", "patient", "sudden", "steady",
    "clever", "honest", "humble", "eager", "walked", "carried", "painted", "whispered", "gathered",
    "followed", "answered", "wondered", "opened", "listened", "across", "beneath", "beyond",
    "during", "toward", "under", "above", "along", "around", "behind", "station", "kitchen",
    "teacher", "doctor", "farmer", "sailor", "baker", "painter", "singer", "dancer", "writer",
    "driver",
)
_VOICES = ("en", "en-us", "en+m3", "en+f2", "en-us+f3", "en+m5")


def _sentence(rng: random.Random, n_words: int) -> str:
    words = [rng.choice(_WORDS) for _ in range(n_words)]
    return " ".join(words).capitalize() + "."


def espeak_available() -> bool:
    return shutil.which("espeak-ng") is not None


def synthesize(text: str, out: Path, voice: str = "en", rate_wpm: int = 175) -> Path:
    """Speak ``text`` into the WAV file ``out`` (22.05 kHz mono) with espeak-ng."""
    if not espeak_available():
        raise UserError("espeak-ng is not installed (apt-get install espeak-ng)")
    out.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["espeak-ng", "-v", voice, "-s", str(rate_wpm), "-w", str(out), text],
                   check=True, capture_output=True, timeout=60)
    return out


@dataclass(frozen=True)
class Utterance:
    id: str
    text: str
    voice: str


def _plan(n_items: int, seed: int, prefix: str = "utt") -> list[Utterance]:
    rng = random.Random(seed)
    seen: set[str] = set()
    out: list[Utterance] = []
    while len(out) < n_items:
        text = _sentence(rng, rng.randint(6, 12))
        if text in seen:
            continue
        seen.add(text)
        out.append(Utterance(f"{prefix}-{len(out):05d}", text, rng.choice(_VOICES)))
    return out


def _write_manifest(path: Path, rows: Sequence[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")
    return path


def make_corpus(directory: Path | str, n_items: int, seed: int = 0) -> Path:
    """Synthesize ``n_items`` distinct English utterances; return the manifest path.

    Layout: ``DIR/wav/utt-00000.wav`` ... and ``DIR/manifest.jsonl`` with relative audio paths,
    ``id``, ``text``, ``speaker`` (the espeak voice) and ``language``. Every item is clean speech
    of about 2-5 s that the default cleaning stages accept. Same seed, same corpus.
    """
    if n_items < 0:
        raise UserError("n_items must be >= 0")
    directory = Path(directory)
    plan = _plan(n_items, seed)
    with ThreadPoolExecutor(max_workers=2) as pool:
        list(pool.map(lambda u: synthesize(u.text, directory / "wav" / f"{u.id}.wav", u.voice), plan))
    rows = [{"id": u.id, "audio": f"wav/{u.id}.wav", "text": u.text, "speaker": u.voice,
             "language": "en"} for u in plan]
    return _write_manifest(directory / "manifest.jsonl", rows)


# --- signal helpers -------------------------------------------------------------------------------

def add_silence(x: np.ndarray, rate: int, lead_s: float, trail_s: float) -> np.ndarray:
    """Pad with digital silence before and after."""
    return np.concatenate([np.zeros(int(round(lead_s * rate)), x.dtype), x,
                           np.zeros(int(round(trail_s * rate)), x.dtype)])


def add_noise(x: np.ndarray, snr_db: float, seed: int = 0) -> np.ndarray:
    """Add white noise at ``snr_db`` relative to the power of the active (non-silent) samples."""
    rng = np.random.default_rng(seed)
    active = x[np.abs(x) > 1e-4]
    p_signal = float(np.mean(active.astype(np.float64) ** 2)) if active.size else 1e-8
    noise = rng.standard_normal(x.shape) * np.sqrt(p_signal / 10 ** (snr_db / 10))
    return (x + noise).astype(np.float32)


def clip(x: np.ndarray, gain: float) -> np.ndarray:
    """Amplify by ``gain`` and hard-clip to [-1, 1]."""
    return np.clip(x * gain, -1.0, 1.0).astype(np.float32)


# --- the mixed corpus -----------------------------------------------------------------------------

def make_mixed_corpus(directory: Path | str, seed: int = 0,
                      n_clean: int = 6) -> tuple[Path, dict[str, str | None]]:
    """A corpus with faulty variants. Returns ``(manifest, expected)`` where ``expected`` maps each
    item id to the reject reason the default stages must give it (``None``: accepted).
    """
    import soundfile as sf
    from ttsfleet.fill_jobs import reasons

    directory = Path(directory)
    wav = directory / "wav"
    plan = _plan(n_clean + 6, seed, prefix="src")
    with ThreadPoolExecutor(max_workers=2) as pool:
        list(pool.map(lambda u: synthesize(u.text, wav / f"{u.id}.wav", u.voice), plan))
    src = {u.id: sf.read(wav / f"{u.id}.wav", dtype="float32")[0] for u in plan}
    clean, extra = plan[:n_clean], plan[n_clean:]
    rows: list[dict] = []
    expected: dict[str, str | None] = {}

    def add(item_id: str, audio: str, text: str, why: str | None, voice: str = "en") -> None:
        rows.append({"id": item_id, "audio": audio, "text": text, "speaker": voice, "language": "en"})
        expected[item_id] = why

    def write(name: str, x: np.ndarray, fmt: str | None = None) -> str:
        sf.write(wav / name, x, ESPEAK_RATE, format=fmt)
        return f"wav/{name}"

    for u in clean:
        add(u.id, f"wav/{u.id}.wav", u.text, None, u.voice)
    a, b, c, d, e, f = extra
    add("padded", write("padded.flac", add_silence(src[a.id], ESPEAK_RATE, 1.5, 2.0)), a.text, None)
    add("dup-exact", f"wav/{clean[0].id}.wav", clean[0].text, reasons.DUPLICATE)
    add("dup-near", write("near.ogg", add_silence(0.7 * src[clean[1].id], ESPEAK_RATE, 0.2, 0.1),
                          "OGG"), clean[1].text, reasons.NEAR_DUPLICATE)
    add("noisy", write("noisy.wav", add_noise(src[b.id], snr_db=3.0, seed=seed)), b.text,
        reasons.LOW_SNR)
    add("clipped", write("clipped.wav", clip(src[c.id], 12.0)), c.text, reasons.CLIPPING)
    add("silence", write("silence.wav", np.zeros(ESPEAK_RATE * 3, np.float32)), "Nothing here.",
        reasons.SILENCE_ONLY)
    add("short", write("short.wav", src[d.id][: int(0.5 * ESPEAK_RATE)]), "Hi.", reasons.TOO_SHORT)
    pause = np.zeros(int(0.6 * ESPEAK_RATE), np.float32)
    story = [src[e.id], pause, src[f.id], pause] * 3
    add("split", write("split.wav", np.concatenate(story)), " ".join([e.text, f.text] * 3), None)
    add("long", write("long.wav", np.concatenate(story * 5)), " ".join([e.text, f.text] * 15),
        reasons.TOO_LONG)
    add("wrong-text", f"wav/{d.id}.wav", " ".join([d.text] * 6), reasons.SPEECH_RATE)
    (wav / "corrupt.wav").write_bytes(b"RIFF\x00\x00\x00\x00WAVEfmt garbage" + bytes(range(256)) * 4)
    add("corrupt", "wav/corrupt.wav", "Broken file.", reasons.UNREADABLE)
    add("missing", "wav/does-not-exist.wav", "Missing file.", reasons.MISSING_FILE)
    return _write_manifest(directory / "manifest.jsonl", rows), expected
