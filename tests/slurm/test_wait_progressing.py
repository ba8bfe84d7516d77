"""The stall rule the Slurm tests wait by (no cluster needed): a wait fails once nothing moved for
``stall_s``, except while Slurm itself has said its jobs wait (a requeued job's BeginTime plus the
scheduler pass after it); a promise too far ahead is not believed, so a stuck job still fails."""

from __future__ import annotations

import time

import pytest
from ttsfleet.slurm.backend import JobInfo

from .conftest import MAX_PROMISE_S, slurm_promise, wait_progressing


def test_nothing_moving_fails_after_the_stall_time() -> None:
    t0 = time.monotonic()
    with pytest.raises(pytest.fail.Exception, match="no progress for 0 s waiting for nothing"):
        wait_progressing(lambda: False, lambda: 1, "nothing", stall_s=0.3, interval=0.05,
                         explain=lambda: "the diagnosis")
    assert 0.3 <= time.monotonic() - t0 < 5


def test_the_diagnosis_is_in_the_failure() -> None:
    with pytest.raises(pytest.fail.Exception, match="the diagnosis"):
        wait_progressing(lambda: False, lambda: 1, "x", stall_s=0.1, interval=0.05,
                         explain=lambda: "the diagnosis")


def test_a_promise_defers_the_stall_until_it_has_passed() -> None:
    promise = time.time() + 1.0
    t0 = time.monotonic()
    with pytest.raises(pytest.fail.Exception, match="Slurm's own wait ended"):
        wait_progressing(lambda: False, lambda: 1, "x", stall_s=0.3, interval=0.05, promised=lambda: promise)
    assert time.monotonic() - t0 >= 1.25  # the promise, then the stall time after it


def test_a_kept_promise_returns_the_value() -> None:
    start = time.time()
    assert wait_progressing(lambda: time.time() > start + 0.6 and "ran", lambda: 1, "x", stall_s=0.2,
                            interval=0.05, promised=lambda: start + 1.0) == "ran"


def test_a_promise_too_far_ahead_is_a_stall_like_any_other() -> None:
    t0 = time.monotonic()
    with pytest.raises(pytest.fail.Exception):
        wait_progressing(lambda: False, lambda: 1, "x", stall_s=0.2, interval=0.05,
                         promised=lambda: time.time() + MAX_PROMISE_S + 60)
    assert time.monotonic() - t0 < 5


def test_only_jobs_waiting_for_their_begin_time_promise_anything() -> None:
    def job(state: str, reason: str, start: float) -> JobInfo:
        return JobInfo(job_id="1", name="f", partition="fill", state=state, reason=reason, start_time=start)

    assert slurm_promise([job("PENDING", "BeginTime", 1000.0), job("PENDING", "BeginTime", 1010.0)],
                         sched_interval_s=5) == 1015.0
    for held in (job("PENDING", "JobHeldAdmin", 1000.0), job("PENDING", "Resources", 5000.0),
                 job("RUNNING", "None", 1000.0), job("PENDING", "BeginTime", 0.0)):
        assert slurm_promise([held]) is None, held
    assert slurm_promise([]) is None
