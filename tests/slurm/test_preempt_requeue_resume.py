"""The cycle the Slurm integration exists for, on real daemons and the real fill job:

fill shards fill the node → a train job needing half of it preempts two of them → they get USR1,
checkpoint, exit 99, are requeued, resume from their checkpoints and finish → the output equals
an uninterrupted run item for item, and the exporter counted the requeues Slurm reports.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from ttsfleet.devtools.localcluster import LocalCluster
from ttsfleet.slurm.backend import SubmitRequest
from ttsfleet.slurm.cli_backend import CliBackend
from ttsfleet.slurm.exporter import SlurmExporter
from ttsfleet.slurm.sbatch import FillShardSpec, fill_submit_request, shard_of

from .conftest import BF_INTERVAL_S, GRACE_PERIOD_S, KILL_WAIT_S, job_by_id, slurm_promise, wait_progressing
from .fillhelpers import STAGES, items_done, output_rows, uninterrupted_run

pytestmark = [pytest.mark.slurm, pytest.mark.audio]

SHARDS = 4


def test_preempted_fill_shards_resume_and_lose_nothing(slurm: LocalCluster, corpus: Path,
                                                       tmp_path: Path) -> None:
    baseline = uninterrupted_run(corpus, tmp_path / "base-out", tmp_path / "base-ckpt")
    assert len(baseline) == 32

    backend = CliBackend(str(slurm.conf_path))
    exporter = SlurmExporter(backend)
    spec = FillShardSpec(manifest=str(corpus), output_root=str(tmp_path / "out"),
                         checkpoint_root=str(tmp_path / "ckpt"), shard_count=SHARDS, gpu_class="h200",
                         log_dir=str(tmp_path / "logs"), grace_period_s=GRACE_PERIOD_S, stages=STAGES,
                         item_delay_s=0.4, checkpoint_every_items=1)
    for d in (spec.log_dir, spec.output_root, spec.checkpoint_root):
        Path(d).mkdir(parents=True)
    # jobs of earlier tests stay listed for MinJobAge: count only what happens from here on
    exporter.poll()
    before = {name: exporter.registry.get_sample_value(name, {"partition": "fill"}) or 0.0
              for name in ("ttsfleet_slurm_requeues_total", "ttsfleet_slurm_preemptions_total")}
    array_id = backend.submit(fill_submit_request(spec, array=f"0-{SHARDS - 1}"))

    seen: list = []  # the jobs the last poll saw (progress() reads them: no extra Slurm call)

    def fill_jobs():
        seen[:] = backend.jobs()
        return [j for j in seen if j.array_job_id == array_id or j.job_id == array_id]

    def progress():
        """What moves while the fill runs: job states and restarts, checkpointed items."""
        return (sorted((j.job_id, j.state, j.restart_count) for j in seen),
                [items_done(spec, i) for i in range(SHARDS)])

    def poll_all_running():
        exporter.poll()
        running = [j for j in fill_jobs() if j.state == "RUNNING"]
        return len(running) == SHARDS and all(items_done(spec, i) >= 1 for i in range(SHARDS))

    wait_progressing(poll_all_running, progress, "4 fill shards running with a checkpoint each",
                     explain=slurm.diagnosis)
    assert exporter.registry.get_sample_value(
        "ttsfleet_slurm_gpus_allocated", {"partition": "fill", "gpu_class": "h200"}) == 4
    assert exporter.registry.get_sample_value("ttsfleet_slurm_gpus_idle", {"gpu_class": "h200"}) == 0

    train_id = backend.submit(SubmitRequest(script="#!/bin/bash\nsleep 2\n", name="train", partition="train",
                                            gres="gpu:h200:2", output=str(tmp_path / "train.out"),
                                            workdir=str(tmp_path)))

    def train_started():
        exporter.poll()
        fill_jobs()
        j = job_by_id(seen, train_id)
        return j is not None and j.state in ("RUNNING", "COMPLETING", "COMPLETED") and j

    train = wait_progressing(train_started, progress, "the train job to start", explain=slurm.diagnosis)
    # Slurm's own submit and start times, not this test's polling (on a loaded machine each poll
    # runs several Slurm commands): the fill shards hold the GPUs at most their grace time plus
    # KillWait (then Slurm kills them), and the backfill scheduler, which preempts for the train
    # job and then starts it, runs every bf_interval: two passes at most, plus 1 s of rounding.
    train_wait = train.start_time - train.submit_time
    assert 0 <= train_wait <= GRACE_PERIOD_S + KILL_WAIT_S + 2 * BF_INTERVAL_S + 1, \
        f"training waited {train_wait:.0f} s for fill"

    def all_done():
        exporter.poll()
        jobs = fill_jobs()
        return len(jobs) == SHARDS and all(j.state == "COMPLETED" for j in jobs) and jobs

    # the two preempted shards wait for their BeginTime and the scheduler pass after it: Slurm's own
    # schedule, not a stall (their StartTime is the one the last poll saw)
    jobs = wait_progressing(all_done, progress, "every fill shard to complete", explain=slurm.diagnosis,
                            promised=lambda: slurm_promise(seen))
    exporter.poll()

    # two shards were preempted (train needed 2 of 4 GPUs), requeued and restarted
    preempted = [j for j in jobs if j.restart_count >= 1]
    assert len(preempted) >= 2, [(j.job_id, j.restart_count) for j in jobs]
    assert {shard_of(j).indices[0] for j in jobs} == set(range(SHARDS))

    # every preemption was an orderly checkpointed stop (USR1 forwarded), none a hard kill
    status = json.loads(subprocess.run(
        [sys.executable, "-m", "ttsfleet.cli", "fill", "status", "--checkpoint", spec.checkpoint_root,
         "--json"],
        capture_output=True, text=True, check=True).stdout)
    assert status["complete"] and status["items_done"] == status["items_total"] == 32
    assert sum(s["orderly_stops"] for s in status["shards"]) == sum(j.restart_count for j in jobs)
    assert sum(s["hard_restarts"] for s in status["shards"]) == 0

    # nothing lost, nothing duplicated: the same rows as the uninterrupted run
    rows = output_rows(Path(spec.output_root))
    assert len({r[0] for r in rows}) == len(rows) == 32
    assert sorted(rows) == sorted(baseline)

    # the appended job log shows the requeue: exit 99, then a second start
    for j in preempted:
        log = next(Path(spec.log_dir).glob(f"*_{j.array_task_id}.out")).read_text()
        assert "exit=99" in log and "restart=1" in log and log.rstrip().endswith(
            next(line for line in log.splitlines()[::-1] if "exit=" in line))

    # the exporter saw what Slurm reports
    requeues = sum(j.restart_count for j in jobs)
    sample = exporter.registry.get_sample_value
    for name in before:
        assert sample(name, {"partition": "fill"}) - before[name] == requeues, name

    # fill GPU-seconds: the exporter's counter against Slurm's accounting, run by run
    if slurm.spec.dbd:
        runs = wait_progressing(
            lambda: (r := sacct_runs(slurm, array_id)) and len(r) == SHARDS + requeues
            and all(state in ("COMPLETED", "REQUEUED", "PREEMPTED") for state, _ in r) and r,
            lambda: sacct_runs(slurm, array_id), "sacct to record every run", explain=slurm.diagnosis)
        accounted = sum(gpu_s for _, gpu_s in runs)
        counted = sample("ttsfleet_slurm_fill_gpu_seconds_total", {"partition": "fill", "gpu_class": "h200"})
        print(f"fill GPU-seconds: exporter {counted}, sacct {accounted}, runs {runs}")
        assert accounted > 0 and counted == accounted, (counted, accounted, runs)


def sacct_runs(cluster: LocalCluster, array_id: str) -> list[tuple[str, int]]:
    """(state, GPU-seconds) of every run of the array's tasks, requeued runs included (-D)."""
    fields = "State,ElapsedRaw,AllocTRES"
    out = subprocess.run(["sacct", "-X", "-D", "-P", "-n", "-j", array_id, "-o", fields],
                         env=cluster.env(), capture_output=True, text=True, check=True).stdout
    runs = []
    for line in out.splitlines():
        state, elapsed, tres = line.split("|")
        gpus = dict(kv.split("=", 1) for kv in tres.split(",") if "=" in kv).get("gres/gpu", "0")
        runs.append((state.split()[0], int(elapsed) * int(gpus)))
    return runs
