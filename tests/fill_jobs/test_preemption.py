"""Real signals, real subprocesses: orderly stops, crashes at commit points, shards, metrics."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from ttsfleet.contracts.exits import PREEMPTED_REQUEUE
from ttsfleet.metrics import CONTRACT

pytestmark = pytest.mark.audio
FAST = ("--stages", "decode,hash")


def status(dirs) -> dict:
    proc = subprocess.run([sys.executable, "-m", "ttsfleet.cli", "fill", "status", "--checkpoint",
                           str(dirs.checkpoint), "--json"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def no_hidden_files(root: Path) -> bool:
    return not [p for p in root.rglob(".*") if p.is_file()]


def stop_with(cli, corpus, dirs, sig) -> dict:
    """Start a slow job, send ``sig`` after its first checkpoint; returns its status."""
    proc = cli.start(corpus, dirs, *FAST, "--item-delay-seconds", "0.2",
                     "--checkpoint-every-items", "2", "--checkpoint-every-seconds", "1000")
    cli.wait_for_event(proc, "checkpoint")
    time.sleep(0.3)
    t0 = time.monotonic()
    proc.send_signal(sig)
    assert proc.wait(timeout=30) == PREEMPTED_REQUEUE
    assert time.monotonic() - t0 < 5.0  # prompt
    return status(dirs)["shards"][0]


def test_sigterm_checkpoints_exits_99_and_resumes(cli, clean_corpus, fast_reference, dirs) -> None:
    st = stop_with(cli, clean_corpus, dirs, signal.SIGTERM)
    assert st["state"] == "stopped" and 0 < st["items_done"] < st["items_total"]
    assert st["orderly_stops"] == 1
    # What the checkpoint counts is committed: audio of exactly those items, nothing half-written.
    rows = [json.loads(line) for p in (dirs.output / ".parts").rglob("part-*.jsonl")
            for line in p.read_text().splitlines()]
    assert len(rows) == st["items_done"]
    assert len(list((dirs.output / "audio").rglob("*.flac"))) == st["items_done"]
    assert no_hidden_files(dirs.output / "audio")
    done = cli.run(clean_corpus, dirs, *FAST)
    assert done.returncode == 0, done.stderr
    assert cli.output_tree(dirs.output) == cli.output_tree(fast_reference.output)
    final = status(dirs)["shards"][0]
    assert final["state"] == "complete" and final["preemptions_survived"] == 1


@pytest.mark.parametrize("sig", [signal.SIGUSR1, signal.SIGINT])
def test_usr1_and_int_stop_like_sigterm(cli, clean_corpus, dirs, sig) -> None:
    st = stop_with(cli, clean_corpus, dirs, sig)
    assert st["state"] == "stopped" and 0 < st["items_done"] < st["items_total"]


def test_sigkill_at_each_commit_point_loses_nothing(cli, clean_corpus, fast_reference, dirs) -> None:
    """Crash (SIGKILL, self-inflicted at a chosen instant) after a batch's audio is visible, after
    its part file, and after the final manifest: each restart cleans up and the end result is
    the uninterrupted run's."""
    args = (*FAST, "--checkpoint-every-items", "3")
    for n, point in enumerate(["after-audio:2", "after-part:1", "after-manifest"], start=1):
        crashed = cli.run(clean_corpus, dirs, *args, env={"TTSFLEET_FILL_FAULT": point})
        assert crashed.returncode == -signal.SIGKILL, (point, crashed.stderr)
        assert status(dirs)["shards"][0]["hard_restarts"] == n - 1
    resumed = cli.run(clean_corpus, dirs, *args)
    assert resumed.returncode == 0, resumed.stderr
    assert cli.output_tree(dirs.output) == cli.output_tree(fast_reference.output)
    assert status(dirs)["shards"][0]["hard_restarts"] == 3
    rows = cli.manifest_rows(dirs.output)
    assert [r["position"] for r in rows] == list(range(len(rows)))


def test_concurrent_shards_share_directories(cli, clean_corpus, fast_reference, dirs) -> None:
    procs = [cli.start(clean_corpus, dirs, *FAST, "--shard", f"{i}/3") for i in range(3)]
    assert [p.wait(timeout=120) for p in procs] == [0, 0, 0]
    rows = cli.manifest_rows(dirs.output)
    assert sorted(r["position"] for r in rows) == list(range(10))
    ref = {r["id"]: r for r in cli.manifest_rows(fast_reference.output)}
    assert all(r == ref[r["id"]] for r in rows)
    audio = {k: v for k, v in cli.output_tree(dirs.output).items() if k.startswith("audio/")}
    assert audio == {k: v for k, v in cli.output_tree(fast_reference.output).items()
                     if k.startswith("audio/")}
    report = status(dirs)
    assert report["complete"] and [s["shard"] for s in report["shards"]] == ["0/3", "1/3", "2/3"]
    assert report["items_done"] == report["items_total"] == 10


def test_shard_from_slurm_array_environment(cli, clean_corpus, dirs) -> None:
    proc = cli.run(clean_corpus, dirs, *FAST, env={"SLURM_ARRAY_TASK_ID": "5", "SLURM_ARRAY_TASK_MIN": "4",
                                                     "SLURM_ARRAY_TASK_COUNT": "2"})
    assert proc.returncode == 0, proc.stderr
    assert [r["position"] for r in cli.manifest_rows(dirs.output)] == [1, 3, 5, 7, 9]


def test_metrics_exposed_while_running(cli, clean_corpus, dirs, unused_port) -> None:
    proc = cli.start(clean_corpus, dirs, *FAST, "--item-delay-seconds", "0.2",
                      "--checkpoint-every-items", "2", "--metrics-port", str(unused_port),
                      "--job-name", "metrics-test")
    try:
        cli.wait_for_event(proc, "checkpoint")
        text = urllib.request.urlopen(f"http://127.0.0.1:{unused_port}/metrics", timeout=10).read().decode()
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == PREEMPTED_REQUEUE
    values = {}
    for line in text.splitlines():
        if line.startswith("ttsfleet_fill_") and 'fill_job="metrics-test"' in line:
            name = line.split("{")[0]
            values[name] = float(line.rsplit(" ", 1)[1])
    fill_specs = [m for m in CONTRACT.values() if m.component == "fill" and m.type != "histogram"]
    for m in fill_specs:
        if m.name.endswith("items_rejected"):
            continue  # labelled by reason: only present once something was rejected
        assert m.exposed_names[0] in values, m.name
    assert values["ttsfleet_fill_items_processed_total"] >= 2
    assert values["ttsfleet_fill_items_lost_total"] == 0
    assert values["ttsfleet_fill_items_total_in_manifest"] == 10
    assert 0 <= values["ttsfleet_fill_seconds_since_checkpoint"] < 30


def test_resume_refuses_a_different_job(cli, clean_corpus, dirs, tmp_path) -> None:
    proc = cli.start(clean_corpus, dirs, *FAST, "--item-delay-seconds", "0.2",
                     "--checkpoint-every-items", "2")
    cli.wait_for_event(proc, "checkpoint")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == PREEMPTED_REQUEUE
    other = cli.run(clean_corpus, dirs, "--stages", "decode")
    assert other.returncode == 2 and "--stages differ" in other.stderr
    changed = tmp_path / "changed.jsonl"
    absolute = str(clean_corpus.parent / "wav/utt-00009")
    changed.write_text(clean_corpus.read_text().replace("wav/utt-00009", absolute))
    other = cli.run(changed, dirs, *FAST)
    assert other.returncode == 2 and "manifest changed" in other.stderr


def test_finished_shard_reruns_as_a_no_op(cli, clean_corpus, fast_reference) -> None:
    before = cli.output_tree(fast_reference.output)
    again = cli.run(clean_corpus, fast_reference, *FAST)
    assert again.returncode == 0 and "already_complete" in again.stderr
    assert cli.output_tree(fast_reference.output) == before


@pytest.fixture
def unused_port() -> int:
    from ttsfleet.devtools.ports import free_port

    return free_port()


def test_merge_finds_duplicates_across_shards(cli, mixed_corpus, tmp_path) -> None:
    """Two shards miss a duplicate pair split between them; the merge rejects it, and the merged
    manifest equals what a single shard writes."""
    manifest, expected = mixed_corpus
    one = cli.JobDirs(tmp_path / "one", tmp_path / "one-ckpt")
    two = cli.JobDirs(tmp_path / "two", tmp_path / "two-ckpt")
    assert cli.run(manifest, one, *FAST).returncode == 0
    for i in range(2):
        assert cli.run(manifest, two, *FAST, "--shard", f"{i}/2").returncode == 0
    per_shard = {r["id"]: r for r in cli.manifest_rows(two.output)}
    assert per_shard["dup-exact"]["status"] == "accepted"  # src-00000 is in the other shard
    proc = subprocess.run([sys.executable, "-m", "ttsfleet.cli", "fill", "merge", "--output",
                           str(two.output)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["duplicates_across_shards"] == 1
    merged = (two.output / "manifest.jsonl").read_bytes()
    assert merged == next(one.output.glob("manifest.shard-*.jsonl")).read_bytes()
    summary = json.loads((two.output / "summary.json").read_text())
    assert summary["unreferenced_audio"] == [per_shard["dup-exact"]["outputs"][0]["audio"]]


def test_merge_refuses_unfinished_jobs(cli, clean_corpus, dirs) -> None:
    assert cli.run(clean_corpus, dirs, *FAST, "--shard", "0/2").returncode == 0
    proc = subprocess.run([sys.executable, "-m", "ttsfleet.cli", "fill", "merge", "--output",
                           str(dirs.output)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "shards [1] of 2 are not finished" in proc.stderr


@pytest.mark.audio
def test_in_process_run_leaves_no_ignored_signals_behind(clean_corpus: Path, dirs) -> None:
    """An embedding process (a test, an agent) that runs the job in-process must not inherit
    SIG_IGN for the stop signals: children it starts later would be unable to trap them."""
    from ttsfleet.cli import main

    assert main(["fill", "run", "--input", str(clean_corpus), "--output", str(dirs.output),
                 "--checkpoint", str(dirs.checkpoint), "--stages", "decode,hash"]) == 0
    for sig in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT):
        assert signal.getsignal(sig) is not signal.SIG_IGN
    # a shell started now can still trap USR1
    out = subprocess.run(["bash", "-c", "trap 'echo trapped; exit 7' USR1; kill -USR1 $$; sleep 5"],
                         capture_output=True, text=True, timeout=20)
    assert out.returncode == 7 and "trapped" in out.stdout
