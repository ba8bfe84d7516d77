"""Kill-anywhere chaos through the fill agent on a real cluster: every way a fill job can stop.

While the agent keeps four shards going, shard jobs are hit at random moments by: SIGKILL of
the fill process (what the OOM killer does: exit 137), SIGKILL of the batch shell (the whole job
dies), SIGTERM to the fill process, the agent's own USR1 eviction, and a training job that makes
Slurm preempt fill. Orderly stops requeue (exit 99); the rest leave the job FAILED and the
agent resubmits the shard. In the end every shard is complete and the output (rows and audio
bytes) is identical to an uninterrupted run.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import time
from pathlib import Path

import pytest
from ttsfleet.devtools.localcluster import LocalCluster
from ttsfleet.slurm.agent import FillAgent
from ttsfleet.slurm.backend import SubmitRequest
from ttsfleet.slurm.cli_backend import CliBackend
from ttsfleet.slurm.ledger import Ledger, RetryPolicy
from ttsfleet.slurm.sbatch import FillShardSpec, shard_of

from ttsfleet.config import FillPolicyConfig

from .conftest import GRACE_PERIOD_S
from .fillhelpers import audio_bytes, fill_pids, items_done, output_rows, uninterrupted_run

pytestmark = [pytest.mark.slurm, pytest.mark.audio, pytest.mark.slow]

SHARDS = 4
ACTIONS = ("sigkill-fill", "sigkill-batch", "sigterm-fill", "agent-usr1", "train-preempts", "sigkill-fill")


def test_kill_anywhere_through_the_agent_ends_complete_and_identical(slurm: LocalCluster, corpus: Path,
                                                                     tmp_path: Path) -> None:
    baseline = uninterrupted_run(corpus, tmp_path / "base-out", tmp_path / "base-ckpt", shards=SHARDS)
    backend = CliBackend(str(slurm.conf_path))
    spec = FillShardSpec(manifest=str(corpus), output_root=str(tmp_path / "out"),
                         checkpoint_root=str(tmp_path / "ckpt"), shard_count=SHARDS, gpu_class="h200",
                         log_dir=str(tmp_path / "logs"), grace_period_s=GRACE_PERIOD_S, stages="decode,hash",
                         item_delay_s=0.5, checkpoint_every_items=1, dataset=tmp_path.name)
    for d in (spec.log_dir, spec.output_root, spec.checkpoint_root):
        Path(d).mkdir(parents=True)
    policy = FillPolicyConfig(grace_period_s=GRACE_PERIOD_S)
    agent = FillAgent(backend, spec, policy, tmp_path / "ledger.json",
                      retry=RetryPolicy(max_retries=len(ACTIONS) + 2, backoff_s=0.5, max_backoff_s=2.0))
    rng = random.Random(1234)
    todo, done_actions = list(ACTIONS), []
    first_seen: dict[str, int] = {}  # job id -> the shard's items_done when the job was first seen running
    next_hit = time.monotonic() + 1.0
    deadline = time.monotonic() + 300
    report = agent.run_once()
    while report.complete < SHARDS:
        assert time.monotonic() < deadline, (done_actions, report.lines())
        assert not report.given_up, report.lines()
        if todo and time.monotonic() >= next_hit:
            victims = progressing_jobs(backend, spec, first_seen)
            if victims:
                job, index = rng.choice(victims)
                action = todo.pop(0)
                hit(action, job.job_id, spec, index, backend, tmp_path)
                done_actions.append((action, index, items_done(spec, index)))
                next_hit = time.monotonic() + rng.uniform(0.5, 1.5)
        else:
            progressing_jobs(backend, spec, first_seen)  # note when each new job was first seen
        time.sleep(0.3)
        report = agent.run_once()

    assert not todo, f"the run ended before every kind of stop happened: {done_actions}"
    assert output_rows(Path(spec.output_root)) == output_rows(tmp_path / "base-out") == baseline
    assert audio_bytes(Path(spec.output_root)) == audio_bytes(tmp_path / "base-out")
    ledger = Ledger.load(tmp_path / "ledger.json", spec.name, SHARDS)
    kills = sum(1 for a, _, _ in done_actions if a.startswith("sigkill"))
    # every SIGKILL left a FAILED job the agent resubmitted (a SIGTERM that lands before the fill
    # job's handler is up does too)
    assert sum(e.failures for e in ledger.shards.values()) >= kills, done_actions
    checkpoints = [json.loads(spec.checkpoint_file(i).read_text()) for i in range(SHARDS)]
    assert sum(c["orderly_stops"] for c in checkpoints) >= 1, (checkpoints, done_actions)
    assert sum(c["hard_restarts"] for c in checkpoints) >= 1, (checkpoints, done_actions)
    assert all(c["state"] == "complete" and c["items_done"] == c["items_total"] for c in checkpoints)


def progressing_jobs(backend: CliBackend, spec: FillShardSpec, first_seen: dict[str, int]) -> list[tuple]:
    """Running shard jobs whose fill process has checkpointed an item *in this attempt*.

    A job that only inherited items from an earlier attempt may still be importing, before its
    stop handler is installed: a SIGTERM then kills it like a SIGKILL, and no kind of orderly
    stop would be exercised. Progress since the job was first seen proves the handler is up.
    """
    victims = []
    for job in backend.jobs():
        shard = shard_of(job)
        if job.state != "RUNNING" or not shard or shard.dataset != spec.name:
            continue
        index = shard.indices[0]
        done, total = items_progress(spec, index)
        started_at = first_seen.setdefault(job.job_id, done)
        # two items left at least: a kill as the shard finishes would leave no FAILED job to count
        if started_at < done < total - 1 and fill_pids(spec, index):
            victims.append((job, index))
    return victims


def items_progress(spec: FillShardSpec, index: int) -> tuple[int, int]:
    """(items done, items in the shard) from the shard's checkpoint; (0, 0) before the first one."""
    try:
        ckpt = json.loads(spec.checkpoint_file(index).read_text())
    except (OSError, ValueError):
        return 0, 0
    return int(ckpt.get("items_done", 0)), int(ckpt.get("items_total", 0))


def hit(action: str, job_id: str, spec: FillShardSpec, index: int, backend: CliBackend, tmp: Path) -> None:
    if action == "sigkill-fill":
        for pid in fill_pids(spec, index):
            os.kill(pid, signal.SIGKILL)
    elif action == "sigterm-fill":
        for pid in fill_pids(spec, index):
            os.kill(pid, signal.SIGTERM)
    elif action == "sigkill-batch":
        backend.cancel(job_id, signal="KILL", batch_only=True)
    elif action == "agent-usr1":
        backend.cancel(job_id, signal="USR1", batch_only=True)
    elif action == "train-preempts":
        backend.submit(SubmitRequest(script="#!/bin/bash\nsleep 2\n", name="train", partition="train",
                                     gres="gpu:h200:2", output=str(tmp / "train-%j.out"), workdir=str(tmp)))
    else:  # pragma: no cover
        raise ValueError(action)
    subprocess.run(["true"])  # keep the action's effect ordered before the next poll
