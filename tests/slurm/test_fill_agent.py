"""The fill agent on a real cluster: fills idle GPUs, holds back while training waits, refills when
training ends, never submits a shard twice, and surfaces Slurm's refusals and outages."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from ttsfleet.devtools.localcluster import LocalCluster
from ttsfleet.devtools.ports import free_port
from ttsfleet.devtools.wait import wait_for
from ttsfleet.slurm.agent import FillAgent
from ttsfleet.slurm.backend import SubmitRequest
from ttsfleet.slurm.cli_backend import CliBackend
from ttsfleet.slurm.ledger import Ledger
from ttsfleet.slurm.sbatch import FillShardSpec, shard_of

from ttsfleet.cli import main
from ttsfleet.config import FillPolicyConfig

from .conftest import GRACE_PERIOD_S, job_by_id

pytestmark = [pytest.mark.slurm, pytest.mark.audio]


def make_spec(corpus: Path, tmp_path: Path, shards: int, delay: float | None, **kw) -> FillShardSpec:
    spec = FillShardSpec(manifest=str(corpus), output_root=str(tmp_path / "out"),
                         checkpoint_root=str(tmp_path / "ckpt"), shard_count=shards, gpu_class="h200",
                         log_dir=str(tmp_path / "logs"), grace_period_s=GRACE_PERIOD_S, stages="decode,hash",
                         item_delay_s=delay, checkpoint_every_items=1,
                         dataset=tmp_path.name,  # jobs of earlier tests stay listed for MinJobAge
                         **kw)
    for d in (spec.log_dir, spec.output_root, spec.checkpoint_root):
        Path(d).mkdir(parents=True, exist_ok=True)
    return spec


def agent_args(spec: FillShardSpec, conf: Path, state: Path) -> list[str]:
    args = ["slurm", "fill-agent", "--dataset", spec.name, "--input", spec.manifest,
            "--output", spec.output_root, "--checkpoint", spec.checkpoint_root,
            "--shards", str(spec.shard_count), "--state", str(state),
            "--log-dir", spec.log_dir, "--grace-time", str(spec.grace_period_s), "--stages", "decode,hash",
            "--checkpoint-every-items", "1", "--slurm-conf", str(conf), "--once", "--json"]
    if spec.item_delay_s is not None:
        args += ["--item-delay-seconds", str(spec.item_delay_s)]
    return args


def train(backend: CliBackend, tmp_path: Path, name: str, gpus: int) -> str:
    return backend.submit(SubmitRequest(script="#!/bin/bash\nsleep 300\n", name=name, partition="train",
                                        gres=f"gpu:h200:{gpus}", output=str(tmp_path / f"{name}.out"),
                                        workdir=str(tmp_path)))


def fill_shards(backend: CliBackend) -> list[int]:
    return sorted(i for j in backend.jobs() if (j.active or j.waiting) and (ref := shard_of(j))
                  for i in ref.indices)


def test_agent_holds_back_for_training_and_refills(slurm: LocalCluster, corpus: Path, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    backend = CliBackend(str(slurm.conf_path))
    spec = make_spec(corpus, tmp_path, shards=8, delay=5.0)  # 4 items x 5 s: shards outlive the test
    state = tmp_path / "ledger.json"
    agent = FillAgent(backend, spec, FillPolicyConfig(grace_period_s=GRACE_PERIOD_S), state)

    a = train(backend, tmp_path, "train-a", 3)
    wait_for(lambda: job_by_id(backend.jobs(), a).state == "RUNNING", 30, "train-a to run")
    b = train(backend, tmp_path, "train-b", 2)
    wait_for(lambda: job_by_id(backend.jobs(), b).reason in ("Resources", "Priority"), 30, "train-b to wait")

    # 1 GPU idle, but training waits for 2: fill holds back
    report = agent.run_once()
    plan = report.plans["h200"]
    assert (plan.free_gpus, plan.admit, report.submitted) == (1, 0, [])
    assert fill_shards(backend) == []

    # training no longer waits: the idle GPU is filled, through the CLI this time
    backend.cancel(b)
    wait_for(lambda: not job_by_id(backend.jobs(), b).waiting, 30, "train-b to leave the queue")
    capsys.readouterr()
    assert main(agent_args(spec, slurm.conf_path, state)) == 0
    out = json.loads(capsys.readouterr().out)
    assert [s[0] for s in out["submitted"]] == [0] and out["plans"]["h200"]["admit"] == 1
    wait_for(lambda: [j for j in backend.jobs() if shard_of(j) and j.state == "RUNNING"], 30,
             "shard 0 to run")
    assert agent.run_once().submitted == []  # the node is full

    # training ends: the three freed GPUs are refilled with the next shards, none twice
    backend.cancel(a)
    wait_for(lambda: not job_by_id(backend.jobs(), a).active, 30, "train-a to end")
    report = agent.run_once()
    assert [s[0] for s in report.submitted] == [1, 2, 3]
    assert fill_shards(backend) == [0, 1, 2, 3]
    restarted = FillAgent(backend, spec, FillPolicyConfig(grace_period_s=GRACE_PERIOD_S), state)
    assert restarted.run_once().submitted == []
    ledger = Ledger.load(state, spec.name, spec.shard_count)
    queued = {shard_of(j).indices[0]: j.job_id for j in backend.jobs() if shard_of(j)}
    assert {i: e.job_id for i, e in ledger.shards.items()} == queued


def test_finished_shards_are_never_resubmitted(slurm: LocalCluster, corpus: Path, tmp_path: Path) -> None:
    backend = CliBackend(str(slurm.conf_path))
    spec = make_spec(corpus, tmp_path, shards=2, delay=None)
    agent = FillAgent(backend, spec, FillPolicyConfig(), tmp_path / "ledger.json")
    first = agent.run_once()
    assert sorted(s[0] for s in first.submitted) == [0, 1] and first.shards_left == 0
    ids = [s[2] for s in first.submitted]
    wait_for(lambda: all(job_by_id(backend.jobs(), i).state == "COMPLETED" for i in ids), 90,
             "both shards to complete")
    again = agent.run_once()
    assert again.submitted == [] and again.plans["h200"].free_gpus == 4
    assert len(list(Path(spec.output_root).glob("manifest.shard-*.jsonl"))) == 2


def test_rejected_submission_is_reported_and_not_recorded(slurm: LocalCluster, corpus: Path, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    backend = CliBackend(str(slurm.conf_path))
    spec = make_spec(corpus, tmp_path, shards=2, delay=None, mem_mb=900_000)  # more than any node has
    state = tmp_path / "ledger.json"
    report = FillAgent(backend, spec, FillPolicyConfig(), state).run_once()
    assert report.submitted == [] and len(report.errors) == 1
    assert "Requested node configuration is not available" in report.errors[0]
    assert Ledger.load(state, spec.name, 2).shards == {}
    assert fill_shards(backend) == []
    capsys.readouterr()
    assert main(agent_args(spec, slurm.conf_path, state) + ["--mem-mb", "900000"]) == 2
    err = capsys.readouterr().err
    assert "Requested node configuration is not available" in err and "Traceback" not in err


def test_unreachable_slurm_is_one_clear_error(slurm: LocalCluster, corpus: Path, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    dead = tmp_path / "dead.conf"
    dead.write_text("\n".join(f"SlurmctldPort={free_port()}" if line.startswith("SlurmctldPort=") else line
                              for line in slurm.conf_path.read_text().splitlines()) + "\n")
    spec = make_spec(corpus, tmp_path, shards=2, delay=None)
    state = tmp_path / "ledger.json"
    assert main(agent_args(spec, dead, state)) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: Slurm controller not responding") and "Traceback" not in err
    assert not state.exists()
    assert main(["slurm", "exporter", "--once", "--slurm-conf", str(dead)]) == 2
    out = capsys.readouterr().out
    assert "ttsfleet_slurm_up 0.0" in out
