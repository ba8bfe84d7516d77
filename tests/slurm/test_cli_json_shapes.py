"""The CLI backend's JSON parsing on output recorded from real Slurm 22.05 and 25.11 daemons.

CI runs Debian's 22.05 only; these recordings (``fixtures/cli_json/<release>/``, made by
``fixtures/cli_json/record.py``) keep the 25.11 shapes checked there too: ``sinfo --json``
holding ``sinfo`` summaries instead of ``nodes``, and ``squeue --json`` hiding finished jobs
unless given ``--states=all``. The queue recorded: array tasks 1-2 exited 3, job 3 runs 3 GPUs,
job 4 waits for 2.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from ttsfleet.slurm.cli_backend import jobs_from_json_doc, nodes_from_json_doc

FIXTURES = Path(__file__).parent / "fixtures" / "cli_json"
RELEASES = ["22.05", "25.11"]


def doc(release: str, name: str) -> dict:
    return json.loads((FIXTURES / release / name).read_text())


def summary(jobs) -> set[tuple]:
    return {(j.job_id, j.name, j.partition, j.state, j.gpus, j.gpu_class, j.array_job_id, j.array_task_id,
             j.exit_code, j.exit_signal, j.comment, j.reason) for j in jobs}


EXPECTED_JOBS = {
    ("2", "arr", "fill", "FAILED", 1, "h200", "1", 0, 3, None, "", "NonZeroExitCode"),
    ("1", "arr", "fill", "FAILED", 1, "h200", "1", 1, 3, None, "", "NonZeroExitCode"),
    ("3", "run", "train", "RUNNING", 3, "h200", None, None, 0, None, "ttsfleet-fill:ds:0/1", "None"),
    ("4", "pend", "train", "PENDING", 2, "h200", None, None, 0, None, "", "Resources"),
}


@pytest.mark.parametrize("release", RELEASES)
def test_recorded_release(release: str) -> None:
    assert (FIXTURES / release / "version.txt").read_text().split()[-1].startswith(release)


@pytest.mark.parametrize("release", RELEASES)
def test_jobs_with_all_states(release: str) -> None:
    jobs = jobs_from_json_doc(doc(release, "squeue_all.json"))
    assert summary(jobs) == EXPECTED_JOBS
    running = next(j for j in jobs if j.job_id == "3")
    assert running.nodes == "n1" and running.start_time > running.submit_time > 0


def test_2511_squeue_hides_finished_jobs_without_states_all() -> None:
    """Why the backend passes ``--states=all``: without it 25.11 leaves out the failed array."""
    assert {j.job_id for j in jobs_from_json_doc(doc("25.11", "squeue.json"))} == {"3", "4"}


@pytest.mark.parametrize(("release", "source"), [("22.05", "sinfo.json"), ("25.11", "scontrol_nodes.json")])
def test_node_records(release: str, source: str) -> None:
    (node,) = nodes_from_json_doc(doc(release, source))
    assert (node.name, node.gpus, node.gpus_used) == ("n1", {"h200": 4}, {"h200": 3})
    assert node.states == {"MIXED"} and node.available
    assert set(node.partitions) == {"train", "fill"}


def test_2511_sinfo_has_no_node_records() -> None:
    """25.11's ``sinfo --json`` is per-partition summaries: the backend must ask scontrol instead."""
    sinfo = doc("25.11", "sinfo.json")
    assert nodes_from_json_doc(sinfo) is None
    assert {s["partition"]["name"] for s in sinfo["sinfo"]} == {"train", "fill"}
