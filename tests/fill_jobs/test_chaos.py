"""Chaos: SIGTERM and SIGKILL at seeded random instants, restarting each time.

The final output (manifest and every audio file) must equal an uninterrupted run's byte for
byte, with each item exactly once, and the checkpoint must account for every interruption.
The 20-kill run uses the fast stages (process start-up dominates: torch is not loaded); a shorter
run with the default stages (``TTSFLEET_CHAOS_KILLS``, default 5) shows that VAD, loudness and the
duplicate index resume identically.
"""

from __future__ import annotations

import os
import random
import signal
import time
from pathlib import Path

import pytest
from ttsfleet.fill_jobs.checkpoint import load_all

from ttsfleet.contracts.exits import PREEMPTED_REQUEUE

pytestmark = [pytest.mark.audio, pytest.mark.slow]


def interrupt_repeatedly(cli, manifest: Path, dirs, args: tuple[str, ...], n: int,
                         rng: random.Random, max_delay: float, first_after: str = "started",
                         resumed_at: list[int] | None = None) -> tuple[int, int]:
    """Start the job and stop it ``n`` times at random instants; returns (SIGTERMs, SIGKILLs).
    The first interruption's random delay starts at event ``first_after`` (``checkpoint``: once a
    commit has landed, so a later start resumes mid-way), the others' at ``started``; each start's
    ``items_done`` is appended to ``resumed_at``."""
    terms = kills = 0
    while terms + kills < n:
        proc = cli.start(manifest, dirs, *args)
        started = cli.wait_for_event(proc, "started")
        assert started["items_done"] < started["items_total"], "finished before enough interruptions"
        if resumed_at is not None:
            resumed_at.append(started["items_done"])
        if terms + kills == 0 and first_after != "started":
            cli.wait_for_event(proc, first_after)
        sig = rng.choice([signal.SIGTERM, signal.SIGKILL])
        time.sleep(rng.uniform(0.0, max_delay))
        proc.send_signal(sig)
        code = proc.wait(timeout=60)
        proc.stderr.close()
        proc.stdout.close()
        if code == PREEMPTED_REQUEUE:
            terms += 1
        elif code == -signal.SIGKILL:
            kills += 1
        elif code == 0:
            pytest.fail(f"the job finished after {terms + kills} interruptions: give it more work")
        else:
            pytest.fail(f"unexpected exit {code} after {sig.name}")
    return terms, kills


def finish(cli, manifest: Path, dirs, args: tuple[str, ...]):
    """The last, uninterrupted run: ``args`` without ``--item-delay-seconds``. The delay only gives
    the kills a window; it is no input of the resume check nor of any output (the references run
    without it). Kept, the fast stages' run slept ~1.4 s through the items left (the torch stages
    hide most of theirs behind their own work)."""
    i = args.index("--item-delay-seconds")
    final = cli.run(manifest, dirs, *args[:i], *args[i + 2:])
    assert final.returncode == 0, final.stderr


def check_against_reference(cli, dirs, reference, expected: dict, terms: int, kills: int) -> None:
    assert cli.output_tree(dirs.output) == cli.output_tree(reference.output)
    rows = cli.manifest_rows(dirs.output)
    assert sorted(r["id"] for r in rows) == sorted(expected)
    assert [r["position"] for r in rows] == list(range(len(expected)))
    (ckpt,) = load_all(dirs.checkpoint)
    assert ckpt.state == "complete"
    assert ckpt.preemptions_survived == terms + kills
    assert ckpt.orderly_stops == terms and ckpt.hard_restarts == kills


@pytest.fixture(scope="module")
def fast_mixed_reference(cli, mixed_corpus, tmp_path_factory):
    base = tmp_path_factory.mktemp("fast-mixed-ref")
    ref = cli.JobDirs(base / "out", base / "ckpt")
    proc = cli.run(mixed_corpus[0], ref, "--stages", "decode,hash")
    assert proc.returncode == 0, proc.stderr
    return ref


def test_twenty_random_kills_fast_stages(cli, mixed_corpus, fast_mixed_reference, dirs) -> None:
    manifest, expected = mixed_corpus
    # kills land within ~2 items of the start (up to 0.25 s at 0.125 s an item): the same draws, and
    # the same instants counted in items, as 0.25 s items and kills within 0.5 s
    args = ("--stages", "decode,hash", "--item-delay-seconds", "0.125", "--checkpoint-every-items", "3")
    terms, kills = interrupt_repeatedly(cli, manifest, dirs, args, 22, random.Random(20261130), 0.25)
    assert terms and kills
    finish(cli, manifest, dirs, args)
    check_against_reference(cli, dirs, fast_mixed_reference, expected, terms, kills)


def test_random_kills_default_stages(cli, mixed_corpus, mixed_reference, dirs) -> None:
    manifest, expected = mixed_corpus
    args = ("--item-delay-seconds", "0.1", "--checkpoint-every-items", "2")
    n = int(os.environ.get("TTSFLEET_CHAOS_KILLS", "5"))  # 20+ in a nightly run; each costs a torch start
    # kills within ~5 items of the start, as 0.2 s items and kills within 1 s were
    terms, kills = interrupt_repeatedly(cli, manifest, dirs, args, n, random.Random(7), min(0.5, 3 / n))
    finish(cli, manifest, dirs, args)
    check_against_reference(cli, dirs, mixed_reference, expected, terms, kills)


#: seconds of the mixed corpus's ``split`` item the codec job keeps (see :func:`codec_corpus`)
SPLIT_SECONDS = 4.0


@pytest.fixture(scope="module")
def codec_corpus(mixed_corpus, tmp_path_factory):
    """The mixed corpus (same items, order, rejects) with ``split``'s audio cut to its first
    :data:`SPLIT_SECONDS`. Without the VAD stage nothing splits it, so the codec encodes it whole:
    25.6 s at the codec's rate, padded with its group's 0.5 s ``short`` to two 25.6 s rows: 5.8 of
    the 7.9 s the codec spent on the whole corpus (CPU, 2 cores, 2026-12-07), in the reference run
    and again in the final one. What is checked (the resumed output equals an uninterrupted run's,
    item for item) does not depend on a clip's length; the items, their order, their groups of 2 and
    their verdicts stay, and the cut clip is still the longer of its group, so ``short`` is still
    padded beside it."""
    import json

    import soundfile as sf

    manifest, expected = mixed_corpus
    base = tmp_path_factory.mktemp("codec-corpus")
    rows = [json.loads(line) for line in manifest.read_text().splitlines() if line.strip()]
    for row in rows:
        audio = manifest.parent / row["audio"]
        if row["id"] == "split":
            x, rate = sf.read(audio, dtype="float32")
            assert len(x) > SPLIT_SECONDS * rate, "the split item is no longer than the cut"
            audio = base / "split-cut.wav"
            sf.write(audio, x[: int(SPLIT_SECONDS * rate)], rate)
        row["audio"] = str(audio)
    assert "split" in {row["id"] for row in rows}
    out = base / "manifest.jsonl"
    out.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return out, expected


@pytest.fixture(scope="module")
def codec_job(cli, codec_corpus, tmp_path_factory):
    """The codec stage (tiny random-weight codec, on CPU) in groups of 2 items, one worker, and an
    uninterrupted reference run of it."""
    base = tmp_path_factory.mktemp("codec-ref")
    config = base / "clean.yaml"
    config.write_text("codec: tiny\nbatchItems: 2\nworkers: 1\nfeatureDevice: cpu\n")
    args = ("--stages", "decode,hash,codec", "--config", str(config))
    ref = cli.JobDirs(base / "out", base / "ckpt")
    proc = cli.run(codec_corpus[0], ref, *args)
    assert proc.returncode == 0, proc.stderr
    assert list((ref.output / "codes").rglob("*.npy")), "the reference made no codes"
    return args, ref


def test_random_kills_codec_stage(cli, codec_corpus, codec_job, dirs) -> None:
    """SIGTERM/SIGKILL while the batch-stage thread encodes: codes, audio and rows as uninterrupted."""
    manifest, expected = codec_corpus
    stage_args, reference = codec_job
    args = (*stage_args, "--item-delay-seconds", "0.2", "--checkpoint-every-items", "2")
    n = int(os.environ.get("TTSFLEET_CHAOS_KILLS", "5"))
    resumed_at: list[int] = []
    # the first stop lands after a group's commit (kills from "started" alone all landed before the
    # first commit, so no start resumed mid-way through the codec's work)
    terms, kills = interrupt_repeatedly(cli, manifest, dirs, args, n, random.Random(16), min(1.5, 8 / n),
                                        first_after="checkpoint", resumed_at=resumed_at)
    assert max(resumed_at) >= 2, f"no start resumed after a committed group: {resumed_at}"
    finish(cli, manifest, dirs, args)
    check_against_reference(cli, dirs, reference, expected, terms, kills)
