"""Fill GPU-seconds against what Slurm records as each run's start and end, without a cluster.

The job records follow Slurm 22.05's slurmctld (src/slurmctld/job_mgr.c): a run that ends sets
``end_time`` (sacct's End and Elapsed); a job requeued by exit code (RequeueExit) stays COMPLETING
with that end until its epilog completes; a job requeued by ``scontrol requeue`` / preemption has
its restart count raised at once and is PENDING+COMPLETING (squeue: COMPLETING) with the end set;
when the requeue finishes (``batch_requeue_fini``), ``start_time`` and ``end_time`` become 0 and
``submit_time`` becomes that second, which trails the run's end by the epilog latency.
"""

from __future__ import annotations

from ttsfleet.slurm.backend import JobInfo, NodeInfo, PartitionInfo, SlurmError
from ttsfleet.slurm.cli_backend import run_end_from_sacct
from ttsfleet.slurm.exporter import ACCOUNTING_WAIT_S, SlurmExporter

START, SUBMIT = 990, 900
LIMIT_END = START + 3600  # what Slurm reports as end_time while a job runs: its time-limit end


class FakeSlurm:
    """One node of 4 h200 GPUs and one 2-GPU fill job whose record the test sets before each poll."""

    name = "fake"

    def __init__(self) -> None:
        self.t = 0.0
        self.read_s = 0.0  # how long reading the nodes takes (the clock moves meanwhile)
        self.job = running()

    def ping(self) -> None:
        return None

    def jobs(self) -> list[JobInfo]:
        return [self.job]

    def nodes(self) -> list[NodeInfo]:
        self.t += self.read_s
        return [NodeInfo("n1", frozenset({"MIXED"}), ("train", "fill"), {"h200": 4})]

    def partitions(self) -> list[PartitionInfo]:
        return [PartitionInfo("train", ("n1",), 10, "OFF", 0, "UP"),
                PartitionInfo("fill", ("n1",), 1, "REQUEUE", 5, "UP")]


class AccountedSlurm(FakeSlurm):
    """With accounting: ``run_end`` answers like sacct's per-run rows once slurmdbd has them."""

    def __init__(self, recorded_end: int | None) -> None:
        super().__init__()
        self.recorded_end = recorded_end
        self.asked: list[tuple[str, float]] = []

    def run_end(self, job_id: str, start_time: float) -> float | None:
        self.asked.append((job_id, start_time))
        return self.recorded_end if start_time == START else None


def running(**kw) -> JobInfo:
    fields = dict(job_id="7", name="fill-0", partition="fill", state="RUNNING", gpus=2, gpu_class="h200",
                  nodes="n1", start_time=START, end_time=LIMIT_END, submit_time=SUBMIT)
    return JobInfo(**(fields | kw))


def pending_after_requeue(requeue_done: int) -> JobInfo:
    """The record once the requeue finished: times reset, submit time = that second."""
    return running(state="PENDING", nodes="", restart_count=1, start_time=0, end_time=0,
                   submit_time=requeue_done)


def gpu_seconds(exporter: SlurmExporter) -> float:
    return exporter.registry.get_sample_value(
        "ttsfleet_slurm_fill_gpu_seconds_total", {"partition": "fill", "gpu_class": "h200"}) or 0.0


def exporter_at(slurm: FakeSlurm, t: float) -> SlurmExporter:
    exporter = SlurmExporter(slurm)
    exporter.clock = lambda: slurm.t
    slurm.t = t
    assert exporter.poll()
    return exporter


def poll(exporter: SlurmExporter, slurm: FakeSlurm, t: float, job: JobInfo) -> float:
    slurm.t, slurm.job = t, job
    assert exporter.poll()
    return gpu_seconds(exporter)


def test_requeued_run_ends_at_its_accounted_end_not_the_reset_submit_time() -> None:
    """The flake: the run ended at 1003 (sacct Elapsed 13 s), the epilog finished in second 1004."""
    slurm = AccountedSlurm(recorded_end=1003)
    exporter = exporter_at(slurm, 1000.2)
    assert gpu_seconds(exporter) == 2 * 10
    # no poll fell into the short COMPLETING window: the next one sees the reset record
    assert poll(exporter, slurm, 1009.5, pending_after_requeue(requeue_done=1004)) == 2 * 13
    assert slurm.asked == [("7", START)]
    assert poll(exporter, slurm, 1012.5, pending_after_requeue(1004)) == 2 * 13  # counted once


def test_requeued_run_waits_for_slurmdbd_to_record_it() -> None:
    slurm = AccountedSlurm(recorded_end=None)
    exporter = exporter_at(slurm, 1000.2)
    assert poll(exporter, slurm, 1009.5, pending_after_requeue(1004)) == 2 * 10
    slurm.recorded_end = 1003
    assert poll(exporter, slurm, 1012.5, pending_after_requeue(1004)) == 2 * 13
    assert poll(exporter, slurm, 1015.5, pending_after_requeue(1004)) == 2 * 13


def test_requeued_run_without_accounting_takes_the_reset_submit_time() -> None:
    """No slurmdbd: the record's submit time is the only trace, an upper bound (epilog latency)."""
    slurm = FakeSlurm()
    exporter = exporter_at(slurm, 1000.2)
    assert poll(exporter, slurm, 1009.5, pending_after_requeue(1004)) == 2 * 14

    class Disabled(AccountedSlurm):
        def run_end(self, job_id: str, start_time: float) -> float | None:
            raise SlurmError("sacct failed: Slurm accounting storage is disabled")

    slurm = Disabled(recorded_end=None)
    exporter = exporter_at(slurm, 1000.2)
    assert poll(exporter, slurm, 1009.5, pending_after_requeue(1004)) == 2 * 14


def test_accounting_that_never_records_the_run_falls_back_after_the_wait() -> None:
    slurm = AccountedSlurm(recorded_end=None)
    exporter = exporter_at(slurm, 1000.2)
    assert poll(exporter, slurm, 1009.5, pending_after_requeue(1004)) == 2 * 10
    assert poll(exporter, slurm, 1009.5 + ACCOUNTING_WAIT_S, pending_after_requeue(1004)) == 2 * 14


def test_requeue_seen_while_completing_ends_at_end_time() -> None:
    """``scontrol requeue`` / preemption past GraceTime: the restart count is raised at once, the
    record is COMPLETING with the run's end, and the submit time is still the old one."""
    slurm = FakeSlurm()
    exporter = exporter_at(slurm, 1000.2)
    completing = running(state="COMPLETING", restart_count=1, end_time=1003)
    assert poll(exporter, slurm, 1003.6, completing) == 2 * 13
    assert poll(exporter, slurm, 1009.5, pending_after_requeue(1004)) == 2 * 13


def test_exit_code_requeue_seen_while_completing_ends_at_end_time() -> None:
    """RequeueExit: COMPLETING with the end set and the restart count unchanged until the epilog."""
    slurm = AccountedSlurm(recorded_end=1003)
    exporter = exporter_at(slurm, 1000.2)
    assert poll(exporter, slurm, 1003.6, running(state="COMPLETING", end_time=1003)) == 2 * 13
    assert poll(exporter, slurm, 1009.5, pending_after_requeue(1004)) == 2 * 13
    assert slurm.asked == []  # the record held the end: no accounting query


def test_live_run_accrues_to_the_second_the_poll_began() -> None:
    """squeue showed the job running at 1000.8; it ended at 1000.9 (end_time 1000) while the poll
    went on reading nodes and partitions until 1001.3: sacct's Elapsed is 10 s, not 11."""
    slurm = FakeSlurm()
    slurm.read_s = 0.5
    exporter = exporter_at(slurm, 1000.8)
    assert gpu_seconds(exporter) == 2 * 10
    assert poll(exporter, slurm, 1005.5, running(state="COMPLETED", end_time=1000)) == 2 * 10


def test_sacct_rows_pick_the_run_by_job_and_start() -> None:
    out = ("41|1700000000|1700000100\n"  # another task of the array (sacct -j lists them all)
           "42|1700000010|1700000030\n"  # the requeued run
           "42|1700000050|Unknown\n")  # the current run
    assert run_end_from_sacct(out, "42", 1700000010) == 1700000030
    assert run_end_from_sacct(out, "42", 1700000050) is None
    assert run_end_from_sacct(out, "43", 1700000010) is None
