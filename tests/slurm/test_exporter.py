"""The exporter's metrics against what ``sinfo`` and ``squeue`` print, on the real cluster."""

from __future__ import annotations

import re
import subprocess
from collections import Counter
from pathlib import Path

import pytest
from ttsfleet.devtools.localcluster import LocalCluster
from ttsfleet.devtools.wait import wait_for
from ttsfleet.slurm.backend import SubmitRequest
from ttsfleet.slurm.cli_backend import CliBackend
from ttsfleet.slurm.exporter import SlurmExporter
from ttsfleet.slurm.rest_backend import RestBackend

from ttsfleet.cli import main
from ttsfleet.metrics import all_exposed_names

from .conftest import job_by_id, squeue_truth

pytestmark = pytest.mark.slurm


def gpus_in(tres: str) -> int:
    m = re.search(r"gpu(?::[\w.-]+)?[:=](\d+)", tres)
    return int(m.group(1)) if m else 0


def sinfo_gpus(cluster: LocalCluster) -> tuple[int, int]:
    """(configured, in use) GPUs from ``sinfo -O Gres,GresUsed``."""
    out = subprocess.run(["sinfo", "-h", "-N", "-O", "NodeList:20,Gres:40,GresUsed:60"], env=cluster.env(),
                         capture_output=True, text=True, check=True).stdout
    total = used = 0
    for line in sorted(set(out.splitlines())):  # one line per node and partition
        _, gres, gres_used = line.split()
        total += gpus_in(gres)
        used += gpus_in(gres_used)
    return total, used


def submit(backend: CliBackend, tmp_path: Path, name: str, partition: str, gpus: int) -> str:
    return backend.submit(SubmitRequest(script="#!/bin/bash\nsleep 300\n", name=name, partition=partition,
                                        gres=f"gpu:h200:{gpus}", output=str(tmp_path / f"{name}.out"),
                                        workdir=str(tmp_path)))


@pytest.mark.parametrize("kind", ["cli", "rest"])
def test_metrics_match_sinfo_and_squeue(kind: str, slurm: LocalCluster, tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    if kind == "rest" and not slurm.spec.restd:
        pytest.skip("slurmrestd not installed")
    backend = CliBackend(str(slurm.conf_path))
    train = submit(backend, tmp_path, "train-a", "train", 2)
    fill = submit(backend, tmp_path, "fill-a", "fill", 1)
    wait_for(lambda: all(job_by_id(backend.jobs(), j).state == "RUNNING" for j in (train, fill)), 30,
             "train and fill to run")
    pending = submit(backend, tmp_path, "train-b", "train", 4)
    wait_for(lambda: job_by_id(backend.jobs(), pending).reason in ("Resources", "Priority"), 30, "train-b")

    source = backend if kind == "cli" else RestBackend(f"unix:{slurm.restd_socket}")
    exporter = SlurmExporter(source)
    for _ in range(5):  # the queue is steady; re-read if Slurm changed it under us
        before = squeue_truth(slurm), sinfo_gpus(slurm)
        assert exporter.poll()
        if (squeue_truth(slurm), sinfo_gpus(slurm)) == before:
            break
    jobs, (total, used) = before
    value = exporter.registry.get_sample_value
    running, waiting, allocated = Counter(), Counter(), Counter()
    for j in jobs:
        if j["state"] == "RUNNING":
            running[j["partition"]] += 1
            allocated[j["partition"]] += gpus_in(j["tres"])
        elif j["state"] == "PENDING":
            waiting[j["partition"]] += 1
    for part in ("train", "fill"):
        assert value("ttsfleet_slurm_jobs_running", {"partition": part}) == running[part]
        assert value("ttsfleet_slurm_jobs_pending", {"partition": part}) == waiting[part]
        labels = {"partition": part, "gpu_class": "h200"}
        assert value("ttsfleet_slurm_gpus_allocated", labels) == allocated[part]
    assert used == sum(allocated.values())
    assert value("ttsfleet_slurm_gpus_idle", {"gpu_class": "h200"}) == total - used
    assert value("ttsfleet_gpus_total", {"gpu_class": "h200"}) == total
    assert value("ttsfleet_gpus", {"gpu_class": "h200", "workload": "training"}) == allocated["train"]
    assert value("ttsfleet_gpus", {"gpu_class": "h200", "workload": "fill"}) == allocated["fill"]
    assert value("ttsfleet_slurm_up") == 1
    # the facts behind the numbers, so the comparison above cannot pass vacuously
    assert (running["train"], allocated["train"], allocated["fill"], waiting["train"]) == (1, 2, 1, 1)

    # every series is in the shared metric contract
    names = {s.name for m in exporter.registry.collect() for s in m.samples}
    assert names - {n for n in names if n.endswith("_created")} <= all_exposed_names()

    if kind == "cli":  # the command prints the same numbers
        capsys.readouterr()
        assert main(["slurm", "exporter", "--once", "--slurm-conf", str(slurm.conf_path)]) == 0
        text = capsys.readouterr().out
        assert f'ttsfleet_slurm_gpus_idle{{gpu_class="h200"}} {float(total - used)}' in text
