"""The cycle the Slurm integration exists for, on real daemons and the real fill job:

fill shards fill the node → a train job needing half of it preempts two of them → they get USR1,
checkpoint, exit 99, are requeued, resume from their checkpoints and finish → the output equals
an uninterrupted run item for item, and the exporter counted the requeues Slurm reports.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from ttsfleet.devtools.localcluster import LocalCluster
from ttsfleet.devtools.wait import wait_for
from ttsfleet.slurm.backend import SubmitRequest
from ttsfleet.slurm.cli_backend import CliBackend
from ttsfleet.slurm.exporter import SlurmExporter
from ttsfleet.slurm.sbatch import FillShardSpec, fill_submit_request, shard_of

from .conftest import GRACE_PERIOD_S, job_by_id
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

    def fill_jobs():
        return [j for j in backend.jobs() if j.array_job_id == array_id or j.job_id == array_id]

    def poll_all_running():
        exporter.poll()
        running = [j for j in fill_jobs() if j.state == "RUNNING"]
        return len(running) == SHARDS and all(items_done(spec, i) >= 1 for i in range(SHARDS))

    wait_for(poll_all_running, 60, "4 fill shards running with a checkpoint each")
    assert exporter.registry.get_sample_value(
        "ttsfleet_slurm_gpus_allocated", {"partition": "fill", "gpu_class": "h200"}) == 4
    assert exporter.registry.get_sample_value("ttsfleet_slurm_gpus_idle", {"gpu_class": "h200"}) == 0

    t_submit = time.monotonic()
    train_id = backend.submit(SubmitRequest(script="#!/bin/bash\nsleep 2\n", name="train", partition="train",
                                            gres="gpu:h200:2", output=str(tmp_path / "train.out"),
                                            workdir=str(tmp_path)))

    def train_started():
        exporter.poll()
        j = job_by_id(backend.jobs(), train_id)
        return j is not None and j.state in ("RUNNING", "COMPLETING", "COMPLETED")

    wait_for(train_started, GRACE_PERIOD_S + 20, "the train job to start")
    train_wait = time.monotonic() - t_submit
    # at worst the grace time plus KillWait (2 s) plus scheduling: fill never holds training longer
    assert train_wait < GRACE_PERIOD_S + 2 + 5, f"training waited {train_wait:.1f} s for fill"

    def all_done():
        exporter.poll()
        jobs = fill_jobs()
        return len(jobs) == SHARDS and all(j.state == "COMPLETED" for j in jobs) and jobs

    jobs = wait_for(all_done, 120, "every fill shard to complete")
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
        runs = wait_for(lambda: (r := sacct_runs(slurm, array_id)) and len(r) == SHARDS + requeues
                        and all(state in ("COMPLETED", "REQUEUED", "PREEMPTED") for state, _ in r) and r,
                        60, "sacct to record every run")
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
