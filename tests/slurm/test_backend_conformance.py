"""The same conformance tests for every Slurm backend, against the real local cluster.

Backends: Slurm's commands with JSON output, the same with ``scontrol -o`` text output (what
Slurm versions without ``--json`` get), slurmrestd over its unix socket, and pyslurm (the C API;
skipped where pyslurm cannot be imported or the cluster is not the Slurm release pyslurm was
built for: PyPI's pyslurm builds only against Slurm 25.11; run them with
``TTSFLEET_SLURM_PREFIX=/opt/slurm-25.11``, see slurm/README.md).
"""

from __future__ import annotations

import importlib.metadata
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from ttsfleet.devtools.localcluster import LocalCluster
from ttsfleet.devtools.ports import free_port
from ttsfleet.devtools.wait import wait_for
from ttsfleet.slurm.backend import (
    SlurmBackend,
    SlurmUnavailable,
    SubmitRejected,
    SubmitRequest,
    pending_training_gpus,
)
from ttsfleet.slurm.cli_backend import CliBackend
from ttsfleet.slurm.rest_backend import RestBackend

from .conftest import GRACE_PERIOD_S, job_by_id, slurm_version, squeue_truth

pytestmark = pytest.mark.slurm

BACKENDS = ["cli-json", "cli-text", "rest", "pyslurm"]


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest, slurm: LocalCluster) -> Iterator[SlurmBackend]:
    if request.param == "pyslurm":
        yield pyslurm_backend(slurm.conf_path, slurm)
        return
    if request.param == "rest":
        if not slurm.spec.restd:
            pytest.skip("no slurmrestd on this cluster (not installed, or Slurm 23.11+: not as root)")
        b = RestBackend(f"unix:{slurm.restd_socket}")
        yield b
        b.close()
        return
    yield CliBackend(str(slurm.conf_path), json_output=request.param == "cli-json")


def pyslurm_backend(conf: Path, cluster: LocalCluster) -> SlurmBackend:
    """A pyslurm backend on ``conf``, or skip: pyslurm missing, or built for another Slurm."""
    try:
        built_for = importlib.metadata.version("pyslurm")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("pyslurm is not installed (PyPI's pyslurm needs Slurm 25.11)")
    running = slurm_version(cluster)
    if built_for.split(".")[:2] != running.split(".")[:2]:
        pytest.skip(f"pyslurm {built_for} needs Slurm {'.'.join(built_for.split('.')[:2])}; this "
                    f"cluster runs {running} (set TTSFLEET_SLURM_PREFIX to a Slurm 25.11 install)")
    from ttsfleet.slurm.pyslurm_backend import PyslurmBackend

    try:
        return PyslurmBackend(str(conf))
    except SlurmUnavailable as exc:
        pytest.skip(str(exc))


def cli_backend_args(param: str, cluster: LocalCluster) -> list[str]:
    """The ``ttsfleet slurm`` options that select the backend of fixture parameter ``param``."""
    if param == "rest":
        return ["--backend", "rest", "--rest-url", f"unix:{cluster.restd_socket}"]
    return ["--backend", "pyslurm" if param == "pyslurm" else "cli"]


def script(body: str) -> str:
    return f"#!/bin/bash\n{body}\n"


def request_for(tmp_path: Path, name: str, partition: str, gpus: int, body: str = "sleep 60",
                **kw) -> SubmitRequest:
    return SubmitRequest(script=script(body), name=name, partition=partition, gres=f"gpu:h200:{gpus}",
                         output=str(tmp_path / f"{name}-%j.out"), workdir=str(tmp_path), **kw)


def test_partitions_and_nodes(backend: SlurmBackend, slurm: LocalCluster) -> None:
    backend.ping()
    parts = {p.name: p for p in backend.partitions()}
    assert set(parts) == {"train", "fill"}
    assert parts["train"].priority_tier > parts["fill"].priority_tier
    assert parts["fill"].preempt_mode == "REQUEUE" and parts["fill"].grace_period_s == GRACE_PERIOD_S
    assert parts["train"].preempt_mode == "OFF"
    assert parts["fill"].nodes == tuple(slurm.node_names)
    (node,) = backend.nodes()
    assert node.gpus == {"h200": 4} and node.available
    assert set(node.partitions) == {"train", "fill"}


def test_submit_list_signal_cancel(backend: SlurmBackend, slurm: LocalCluster, tmp_path: Path) -> None:
    marker, ready = tmp_path / "usr1", tmp_path / "ready"
    body = f"trap 'echo got >> {marker}' USR1\ntouch {ready}\nwhile true; do sleep 0.1; done"
    req = request_for(tmp_path, "conf-fill", "fill", 1, body, comment="ttsfleet-fill:ds:0/1",
                      signal="B:USR1@5")
    job_id = backend.submit(req)
    assert job_id.isdigit()
    job = wait_for(lambda: (j := job_by_id(backend.jobs(), job_id)) and j.state == "RUNNING" and j,
                   30, "the job to run")
    assert (job.partition, job.name, job.gpus, job.gpu_class) == ("fill", "conf-fill", 1, "h200")
    assert job.comment == "ttsfleet-fill:ds:0/1" and job.nodes == "n1" and job.restart_count == 0
    truth = {t["id"]: t for t in squeue_truth(slurm)}
    assert truth[job_id]["state"] == "RUNNING" and truth[job_id]["partition"] == "fill"
    (node,) = backend.nodes()
    if node.gpus_used is not None:
        assert node.gpus_used == {"h200": 1}
    wait_for(ready.exists, 30, "the batch script to install its trap")
    backend.cancel(job_id, signal="USR1", batch_only=True)
    wait_for(lambda: marker.exists() and "got" in marker.read_text(), 15, "USR1 in the batch shell")
    assert job_by_id(backend.jobs(), job_id).state == "RUNNING"  # a signal is not a cancel
    backend.cancel(job_id)
    wait_for(lambda: not job_by_id(backend.jobs(), job_id).active, 30, "the job to end")


def test_pending_training_demand(backend: SlurmBackend, tmp_path: Path) -> None:
    running = backend.submit(request_for(tmp_path, "train-a", "train", 3))
    wait_for(lambda: (j := job_by_id(backend.jobs(), running)) and j.state == "RUNNING", 30, "train-a")
    waiting = backend.submit(request_for(tmp_path, "train-b", "train", 2))
    job = wait_for(lambda: (j := job_by_id(backend.jobs(), waiting)) and j.waiting and j, 30, "train-b")
    time.sleep(0.5)  # one more scheduling pass: still waiting, for resources
    assert job_by_id(backend.jobs(), waiting).state == "PENDING"
    assert pending_training_gpus(backend.jobs(), "fill") == {"h200": 2}
    assert job.gpus == 2


def test_rejected_submission_surfaces_slurm_message(backend: SlurmBackend, tmp_path: Path) -> None:
    before = {j.job_id for j in backend.jobs()}
    with pytest.raises(SubmitRejected, match="(?i)invalid partition"):
        backend.submit(request_for(tmp_path, "bad", "no-such-partition", 1))
    with pytest.raises(SubmitRejected, match="(?i)(requested node configuration|gres)"):
        backend.submit(request_for(tmp_path, "too-big", "fill", 64))
    # Slurm may keep a FAILED record (BadConstraints) of a refused job, but nothing waits or runs
    assert not [j for j in backend.jobs() if j.job_id not in before and (j.active or j.waiting)]


def test_unreachable_slurm(slurm: LocalCluster, tmp_path: Path) -> None:
    dead = tmp_path / "slurm.conf"
    text = slurm.conf_path.read_text()
    dead.write_text("\n".join(f"SlurmctldPort={free_port()}" if line.startswith("SlurmctldPort=") else line
                              for line in text.splitlines()) + "\n")
    with pytest.raises(SlurmUnavailable, match="not responding"):
        CliBackend(str(dead)).ping()
    missing = tmp_path / "no.sock"
    with RestBackend(f"unix:{missing}") as rest, pytest.raises(SlurmUnavailable, match="unreachable"):
        rest.jobs()
    assert not os.path.exists(missing)


def test_array_tasks_and_exit_status(backend: SlurmBackend, tmp_path: Path) -> None:
    req = request_for(tmp_path, "conf-array", "fill", 1, "exit 3", array="0-1")
    array_id = backend.submit(req)

    def ended() -> list:
        tasks = [j for j in backend.jobs() if j.array_job_id == array_id]
        return tasks if len(tasks) == 2 and not any(j.live for j in tasks) else []

    tasks = wait_for(ended, 30, "both array tasks to end")
    assert sorted(j.array_task_id for j in tasks) == [0, 1]  # task 0 is a real index, not "none"
    assert {(j.state, j.exit_code, j.exit_signal) for j in tasks} == {("FAILED", 3, None)}


def test_unreachable_slurm_pyslurm(slurm: LocalCluster, tmp_path: Path) -> None:
    """pyslurm re-initialised on a slurm.conf whose controller port is dead, then back."""
    dead = tmp_path / "slurm.conf"
    dead.write_text("\n".join(f"SlurmctldPort={free_port()}" if line.startswith("SlurmctldPort=") else line
                              for line in slurm.conf_path.read_text().splitlines()) + "\n")
    with pytest.raises(SlurmUnavailable, match="not responding"):
        pyslurm_backend(dead, slurm).ping()
    pyslurm_backend(slurm.conf_path, slurm).ping()  # the real one answers again


def test_preempted_fill_is_requeued(backend: SlurmBackend, tmp_path: Path) -> None:
    """Training preempts a fill job: it is requeued (restart count 1) and waits; training runs."""
    body = "trap 'exit 99' USR1 TERM\nwhile true; do sleep 0.1; done"
    fill = backend.submit(request_for(tmp_path, "conf-preempted", "fill", 4, body, signal="B:USR1@5"))
    wait_for(lambda: job_by_id(backend.jobs(), fill).state == "RUNNING", 30, "the fill job to run")
    train = backend.submit(request_for(tmp_path, "conf-train", "train", 2))
    wait_for(lambda: job_by_id(backend.jobs(), train).state == "RUNNING", 60, "training to run")
    job = wait_for(lambda: (j := job_by_id(backend.jobs(), fill)) and j.restart_count == 1 and j, 30,
                   "the fill job's requeue")
    assert job.live and not job.active  # requeued: waits for GPUs again
    assert pending_training_gpus(backend.jobs(), "fill") == {}


def test_fill_agent_over_backend(backend: SlurmBackend, request: pytest.FixtureRequest, slurm: LocalCluster,
                                 corpus: Path, tmp_path: Path) -> None:
    """The fill agent driven through this backend (and once through ``--backend`` on the CLI):
    it holds back while training waits, fills the idle GPU, refills when training ends."""
    from ttsfleet.slurm.agent import FillAgent
    from ttsfleet.slurm.ledger import Ledger
    from ttsfleet.slurm.sbatch import FillShardSpec, shard_of

    from ttsfleet.cli import main
    from ttsfleet.config import FillPolicyConfig

    spec = FillShardSpec(manifest=str(corpus), output_root=str(tmp_path / "out"),
                         checkpoint_root=str(tmp_path / "ckpt"), shard_count=8, gpu_class="h200",
                         log_dir=str(tmp_path / "logs"), grace_period_s=GRACE_PERIOD_S, stages="decode,hash",
                         item_delay_s=5.0, checkpoint_every_items=1, dataset=f"agent-{tmp_path.name}")
    for d in (spec.log_dir, spec.output_root, spec.checkpoint_root):
        Path(d).mkdir(parents=True, exist_ok=True)
    state = tmp_path / "ledger.json"
    agent = FillAgent(backend, spec, FillPolicyConfig(grace_period_s=GRACE_PERIOD_S), state)

    def shards() -> list[int]:
        return sorted(i for j in backend.jobs()
                      if j.live and (ref := shard_of(j)) and ref.dataset == spec.name for i in ref.indices)

    a = backend.submit(request_for(tmp_path, "train-a", "train", 3))
    wait_for(lambda: job_by_id(backend.jobs(), a).state == "RUNNING", 30, "train-a to run")
    b = backend.submit(request_for(tmp_path, "train-b", "train", 2))
    wait_for(lambda: job_by_id(backend.jobs(), b).reason in ("Resources", "Priority"), 30, "train-b to wait")
    plan = agent.run_once().plans["h200"]
    assert (plan.free_gpus, plan.admit, shards()) == (1, 0, [])

    backend.cancel(b)
    wait_for(lambda: not job_by_id(backend.jobs(), b).waiting, 30, "train-b to leave the queue")
    args = ["slurm", "fill-agent", "--dataset", spec.name, "--input", spec.manifest,
            "--output", spec.output_root, "--checkpoint", spec.checkpoint_root, "--shards", "8",
            "--state", str(state), "--log-dir", spec.log_dir, "--grace-time", str(GRACE_PERIOD_S),
            "--stages", "decode,hash", "--checkpoint-every-items", "1", "--item-delay-seconds", "5",
            "--slurm-conf", str(slurm.conf_path), "--once",
            *cli_backend_args(request.node.callspec.params["backend"], slurm)]
    assert main(args) == 0
    assert shards() == [0]
    wait_for(lambda: [j for j in backend.jobs() if shard_of(j) and j.state == "RUNNING"], 30,
             "shard 0 to run")
    assert agent.run_once().submitted == []  # the node is full

    backend.cancel(a)
    wait_for(lambda: not job_by_id(backend.jobs(), a).active, 30, "train-a to end")
    assert [s[0] for s in agent.run_once().submitted] == [1, 2, 3]
    assert shards() == [0, 1, 2, 3]
    ledger = Ledger.load(state, spec.name, spec.shard_count)
    queued = {shard_of(j).indices[0]: j.job_id for j in backend.jobs() if j.live and shard_of(j)}
    assert {i: e.job_id for i, e in ledger.shards.items()} == queued
