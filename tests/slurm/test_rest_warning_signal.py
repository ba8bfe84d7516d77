"""slurmrestd: the API version is negotiated, and a preempted fill shard submitted over REST gets
its warning signal (USR1) at preemption, not SIGTERM when GraceTime runs out.

Before, the REST backend stripped ``B:`` from ``B:USR1@grace`` (22.05's slurmrestd rejects it), so
Slurm signalled the job's steps, of which a plain batch job has none: the fill job only saw
SIGTERM at the end of the grace time and training waited for it. Now on v0.0.38 the fill job
runs as an srun step (the wrapper does it when the backend asks), on v0.0.39+ the batch flag is
sent as ``kill_warning_flags``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from ttsfleet.devtools.localcluster import LocalCluster
from ttsfleet.devtools.wait import wait_for
from ttsfleet.slurm.backend import SlurmError, SubmitRequest
from ttsfleet.slurm.cli_backend import CliBackend
from ttsfleet.slurm.rest_backend import RestBackend, choose_version, job_description
from ttsfleet.slurm.sbatch import FillShardSpec, fill_submit_request

from .conftest import (
    BF_INTERVAL_S,
    GRACE_PERIOD_S,
    KILL_WAIT_S,
    STALL_S,
    job_by_id,
    slurm_promise,
    wait_progressing,
)
from .fillhelpers import items_done, output_rows, uninterrupted_run

pytestmark = pytest.mark.slurm


@pytest.fixture
def rest(slurm: LocalCluster):
    if not slurm.spec.restd:
        pytest.skip("slurmrestd not installed")
    with RestBackend(f"unix:{slurm.restd_socket}") as b:
        yield b


def test_api_version_is_negotiated_with_the_daemon(rest: RestBackend) -> None:
    served = rest.served_versions()
    assert {"v0.0.36", "v0.0.37", "v0.0.38"} <= served  # what the local cluster's daemon loads
    assert rest.api == "v0.0.38"  # the newest of them this backend speaks
    rest.ping()
    with pytest.raises(SlurmError, match="ttsfleet speaks v0.0.38"):
        choose_version({"v0.0.36", "v0.0.37"})


def test_batch_flag_spelling_per_api_version() -> None:
    req = SubmitRequest(script="#!/bin/bash\n", name="f", partition="fill", gres="gpu:h200:1",
                        signal="B:USR1@30", environment={"A": "1"}, mem_mb=900)
    old = job_description(req, "v0.0.38")
    assert old["job"]["signal"] == "USR1@30" and old["job"]["environment"]["TTSFLEET_FILL_AS_STEP"] == "1"
    assert old["script"] and old["job"]["gres"] == "gpu:h200:1"
    new = job_description(req, "v0.0.41")["job"]
    assert (new["kill_warning_flags"], new["kill_warning_signal"]) == (["BATCH_JOB"], "USR1")
    assert new["kill_warning_delay"]["number"] == 30 and new["memory_per_node"]["number"] == 900
    assert "TTSFLEET_FILL_AS_STEP=1" not in new["environment"] and "A=1" in new["environment"]
    assert new["tres_per_node"] == "gres/gpu:h200:1" and new["script"]
    assert "signal" not in new


@pytest.mark.audio
def test_rest_submitted_shard_gets_usr1_at_preemption(slurm: LocalCluster, rest: RestBackend, corpus: Path,
                                                      tmp_path: Path) -> None:
    shards = 4
    baseline = uninterrupted_run(corpus, tmp_path / "base-out", tmp_path / "base-ckpt", shards=shards)
    spec = FillShardSpec(manifest=str(corpus), output_root=str(tmp_path / "out"),
                         checkpoint_root=str(tmp_path / "ckpt"), shard_count=shards, gpu_class="h200",
                         log_dir=str(tmp_path / "logs"), grace_period_s=GRACE_PERIOD_S, stages="decode,hash",
                         item_delay_s=0.4, checkpoint_every_items=1, dataset=tmp_path.name)
    for d in (spec.log_dir, spec.output_root, spec.checkpoint_root):
        Path(d).mkdir(parents=True)
    ids = [rest.submit(fill_submit_request(spec, i)) for i in range(shards)]
    wait_progressing(lambda: all(job_by_id(rest.jobs(), i).state == "RUNNING" for i in ids)
                     and all(items_done(spec, i) >= 1 for i in range(shards)),
                     lambda: sorted((j.job_id, j.state) for j in rest.jobs()), "4 shards checkpointing",
                     explain=slurm.diagnosis)

    cli = CliBackend(str(slurm.conf_path))
    train = cli.submit(SubmitRequest(script="#!/bin/bash\nsleep 1\n", name="train", partition="train",
                                     gres="gpu:h200:2", output=str(tmp_path / "train.out"),
                                     workdir=str(tmp_path)))
    started = wait_for(lambda: (j := job_by_id(cli.jobs(), train)).state in ("RUNNING", "COMPLETING",
                                                                              "COMPLETED") and j,
                       GRACE_PERIOD_S + KILL_WAIT_S + STALL_S, "the train job to start")
    # Slurm's own submit and start times (this test's polling of two backends is slow when the
    # machine is loaded): the backfill scheduler preempts for the train job and starts it, one
    # pass per bf_interval each
    waited = started.start_time - started.submit_time
    seen: list = []  # the shards as the last poll saw them (progress and promise read them)

    def all_done():
        seen[:] = [job_by_id(rest.jobs(), i) for i in ids]
        return all(j is not None and j.state == "COMPLETED" for j in seen) and list(seen)

    # the preempted shards wait for their BeginTime and the scheduler pass after it (Slurm's own
    # schedule, which it reports as their StartTime), then run again
    jobs = wait_progressing(all_done,
                            lambda: ([items_done(spec, i) for i in range(shards)],
                                     [(j.state, j.restart_count) for j in seen if j is not None]),
                            "every shard to complete", explain=slurm.diagnosis,
                            promised=lambda: slurm_promise(j for j in seen if j is not None))

    stopped = [json.loads(spec.checkpoint_file(i).read_text()) for i in range(shards)]
    preempted = [c for c in stopped if c["orderly_stops"]]
    assert len(preempted) >= 2 and sum(j.restart_count for j in jobs) >= 2
    # the warning signal, not the end-of-grace SIGTERM, stopped them (the first stop signal is the
    # one recorded: the regression this guards let only the SIGTERM through, at the end of grace)
    assert {c["last_stop_signal"] for c in preempted} == {"SIGUSR1"}, preempted
    assert all(c["hard_restarts"] == 0 for c in stopped)
    assert waited < GRACE_PERIOD_S + 2 * BF_INTERVAL_S, \
        f"training waited {waited:.0f} s (grace {GRACE_PERIOD_S})"
    assert sorted(output_rows(Path(spec.output_root))) == sorted(baseline)
