"""A failed operator test costs that test, never the run (tests/operator/stopping.py): the stops
of ``running_operator`` and the teardown of a test's event loop are bounded in real time, even
when a background task swallows its cancellation. No Kubernetes needed; a few seconds in all."""

from __future__ import annotations

import asyncio
import contextlib
import re
import subprocess
import sys
import textwrap
import time
import types
from pathlib import Path
from typing import Any

import pytest

import tests.operator.conftest as suite
from tests.operator import stopping

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def short_bounds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stopping, "GRACE_S", 0.2)
    monkeypatch.setattr(stopping, "CANCEL_S", 1.5)


def fake_operator(swallow: int | None, release: asyncio.Event | None = None, fail: Exception | None = None):
    """An operator_task stand-in: ready at once, deaf to the stop flag; swallows the first
    ``swallow`` cancellations (None: every one until ``release`` is set); raises ``fail`` if it
    ends otherwise."""
    async def operator_task(rt: Any, *, namespaces: Any, stop_flag: asyncio.Event,
                            ready_flag: asyncio.Event) -> None:
        ready_flag.set()
        swallowed = 0
        while release is None or not release.is_set():
            try:
                await (release or asyncio.Event()).wait()
            except asyncio.CancelledError:
                swallowed += 1
                if swallow is not None and swallowed > swallow:
                    raise
        if fail is not None:
            raise fail
    return operator_task


async def test_a_failing_body_exits_in_bounded_time_though_the_operator_swallows_a_cancellation(
        monkeypatch: pytest.MonkeyPatch, short_bounds: None) -> None:
    monkeypatch.setattr(suite, "operator_task", fake_operator(swallow=1))
    rt = types.SimpleNamespace()
    started = time.monotonic()
    with pytest.raises(AssertionError, match="the body failed") as err:
        async with suite.running_operator(rt):  # type: ignore[arg-type]
            raise AssertionError("the body failed")
    assert time.monotonic() - started < 0.2 + 1.5 + 1.0
    assert rt.kopf_task.cancelled()
    assert not getattr(err.value, "__notes__", None)  # it did stop: nothing to add


async def test_an_operator_that_never_stops_is_named_not_waited_for(
        monkeypatch: pytest.MonkeyPatch, short_bounds: None) -> None:
    release = asyncio.Event()
    monkeypatch.setattr(suite, "operator_task", fake_operator(swallow=None, release=release))
    rt = types.SimpleNamespace()
    started = time.monotonic()
    try:
        with pytest.raises(AssertionError, match="the body failed") as err:
            async with suite.running_operator(rt):  # type: ignore[arg-type]
                raise AssertionError("the body failed")
        assert time.monotonic() - started < 0.2 + 1.5 + 1.0
        # the test's own error stays its failure; the stuck operator is a note on it
        (note,) = err.value.__notes__
        assert "StuckTask: the kopf operator task did not finish" in note
        assert "await (release or asyncio.Event()).wait()" in note  # where it waits
        # a body that succeeded: the stuck operator is the error
        with pytest.raises(stopping.StuckTask, match="the kopf operator task did not finish"):
            async with suite.running_operator(types.SimpleNamespace()):  # type: ignore[arg-type]
                pass
    finally:
        release.set()  # let both go, so this test's own teardown is clean
        await asyncio.sleep(0)


async def test_an_operator_killed_in_the_body_or_failing_on_stop(
        monkeypatch: pytest.MonkeyPatch, short_bounds: None) -> None:
    monkeypatch.setattr(suite, "operator_task", fake_operator(swallow=0))
    async with suite.running_operator(rt := types.SimpleNamespace()):  # type: ignore[arg-type]
        rt.kopf_task.cancel()  # killed mid-pass (test_e2e_restart does): a clean exit
    release = asyncio.Event()
    release.set()
    monkeypatch.setattr(suite, "operator_task", fake_operator(swallow=0, release=release,
                                                              fail=ValueError("kopf failed")))
    with pytest.raises(ValueError, match="kopf failed"):  # what the operator failed with
        async with suite.running_operator(types.SimpleNamespace()):  # type: ignore[arg-type]
            await asyncio.sleep(0)


@pytest.mark.looptime
async def test_bounds_are_real_seconds_under_looptime() -> None:
    """A loop-clock timeout under looptime fires after fake seconds, or when the loop idles on
    I/O never; wait_real's is a thread timer."""
    never = asyncio.create_task(asyncio.Event().wait())
    started = time.monotonic()
    assert await stopping.wait_real([never], 0.3) == {never}
    assert 0.25 < time.monotonic() - started < 3.0
    never.cancel()


def test_the_watchdog_stops_a_loop_teardown_waiting_for_a_stubborn_task() -> None:
    """What pytest-asyncio's runner does at teardown (cancel every task once, then wait for all)
    ends with an error naming the task, instead of never."""
    loop = asyncio.new_event_loop()
    release = asyncio.Event()

    async def stubborn() -> None:
        while not release.is_set():
            with contextlib.suppress(asyncio.CancelledError):  # every cancellation
                await release.wait()
    task = loop.create_task(stubborn(), name="stubborn")
    loop.run_until_complete(asyncio.sleep(0))
    dog = stopping.LoopWatchdog(loop, 0.5)
    started = time.monotonic()
    try:
        with pytest.raises(RuntimeError, match="Event loop stopped before Future completed"):
            asyncio.runners._cancel_all_tasks(loop)  # type: ignore[attr-defined]
    finally:
        dog.disarm()
    assert time.monotonic() - started < 5.0
    assert dog.fired == 1 and dog.report is not None
    assert "stubborn" in dog.report and "await release.wait()" in dog.report
    release.set()
    loop.run_until_complete(task)
    loop.close()


INNER = '''
import asyncio

import pytest


def leave_a_stubborn_task():
    async def stubborn():
        while True:
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                pass
    global KEEP
    KEEP = asyncio.get_running_loop().create_task(stubborn(), name="stubborn background task")


async def test_fails_and_leaves_a_stubborn_task():
    leave_a_stubborn_task()
    await asyncio.sleep(0)
    assert 1 == 2, "the body failed"


async def waiting_for_what_never_comes():
    await asyncio.Event().wait()


@pytest.mark.timeout(1)
async def test_times_out_and_leaves_a_stubborn_task():
    leave_a_stubborn_task()
    await waiting_for_what_never_comes()


def test_the_run_goes_on():
    pass
'''


def test_a_stuck_teardown_costs_one_test_not_the_run(tmp_path: Path) -> None:
    """A real pytest run with this suite's hooks: a test fails (an assertion; pytest-timeout's
    one alarm, as in the CI run that hung), then its teardown (pytest-asyncio's runner waiting
    for a task that swallows every cancellation) ends after the limit as that test's error; the
    failure, and where a timed-out test waited, were printed as they happened; the run goes on."""
    (tmp_path / "pytest.ini").write_text("[pytest]\nasyncio_mode = auto\n")
    (tmp_path / "conftest.py").write_text(textwrap.dedent(f'''
        import sys
        sys.path.append({str(REPO)!r})  # last: the repository's operator/ must not shadow the stdlib's
        import tests.operator.conftest as suite
        from tests.operator.conftest import (  # noqa: F401  (this suite's hooks)
            pytest_runtest_logreport, pytest_runtest_makereport, pytest_runtest_teardown)
        suite.TEARDOWN_LIMIT_S = 1.0
    '''))
    (tmp_path / "test_inner.py").write_text(INNER)
    started = time.monotonic()
    run = subprocess.run([sys.executable, "-P", "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          "-W", "ignore::DeprecationWarning", str(tmp_path)],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120)
    out = run.stdout + run.stderr
    assert time.monotonic() - started < 60, out
    assert re.search(r"2 failed, 1 passed, (\d+ warnings?, )?2 errors in", out), out
    assert "!!! test_inner.py::test_fails_and_leaves_a_stubborn_task failed (call)" in out, out
    assert "AssertionError: the body failed" in out, out
    assert "!!! test_inner.py::test_times_out_and_leaves_a_stubborn_task failed (call)" in out, out
    assert "Timeout (>1.0s) from pytest-timeout" in out, out
    assert "where the test waited when pytest-timeout stopped it" in out, out
    assert "in waiting_for_what_never_comes" in out, out
    for test in ("test_fails_and_leaves_a_stubborn_task", "test_times_out_and_leaves_a_stubborn_task"):
        assert f"test_inner.py::{test}: teardown stuck" in out, out  # on the terminal at once
        assert f"teardown of test_inner.py::{test} still running after 1 s" in out, out  # its error
    assert "stubborn background task" in out, out
