"""The Slurm fill agent: keep idle fill-partition GPUs busy with dataset shards, never twice.

Each pass reads Slurm once, builds one observation per GPU class (:mod:`ttsfleet.slurm.observe`),
asks :func:`ttsfleet.policy.plan_fill` what to do and carries the plan out:

* ``admit``: submit that many untaken shards on that class (the policy already counts the fill
  jobs Slurm holds queued for the class: requeued jobs restart by themselves as GPUs free up);
* ``evict``: send the warning signal (USR1 to the batch shell), the same orderly stop as a Slurm
  preemption: the shard checkpoints, exits 99 and is requeued.

Training preempts fill through Slurm itself (partition PriorityTier); while training waits the
policy admits nothing. Shards are recorded in a :class:`~ttsfleet.slurm.ledger.Ledger` before
submission, so no shard is submitted twice, even across agent restarts or failed submissions.

A job that ends without finishing its shard and without being requeued (SIGKILL or the OOM
killer: exit 137; a full disk or an unreadable checkpoint: exit 1/2; a cancelled job) would
otherwise stall its shard for ever. Each pass compares the ledger with the queue: a shard whose
job left the live states while its checkpoint does not say ``complete`` is marked failed and
resubmitted after a backoff, within a retry budget (:class:`~ttsfleet.slurm.ledger.RetryPolicy`);
the new job resumes from the shard's checkpoint. Failed shards are exported as
``ttsfleet_slurm_fill_shards_stalled`` and alerted on.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from ttsfleet.slurm.backend import JobInfo, SlurmBackend, SlurmUnavailable, SubmitRejected
from ttsfleet.slurm.ledger import Ledger, RetryPolicy, ShardEntry
from ttsfleet.slurm.observe import ClassState, observe_classes, take_snapshot
from ttsfleet.slurm.sbatch import FillShardSpec, fill_submit_request, shard_of

from ttsfleet.config import FillPolicyConfig
from ttsfleet.contracts.fill import work_at_risk
from ttsfleet.metrics import Collectors
from ttsfleet.policy import FillPlan, plan_fill

log = logging.getLogger(__name__)


@dataclass
class PassReport:
    """What one agent pass saw, decided and did."""

    plans: dict[str, FillPlan] = field(default_factory=dict)
    pending_fill: dict[str, int] = field(default_factory=dict)
    submitted: list[tuple[int, str, str]] = field(default_factory=list)  # (shard, class, job id)
    evicted: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    shards_left: int = 0
    failed: list[tuple[int, str]] = field(default_factory=list)  # (shard, what happened) this pass
    stalled: list[int] = field(default_factory=list)  # failed shards no job carries now
    given_up: list[int] = field(default_factory=list)  # stalled shards out of retries
    complete: int = 0

    def lines(self) -> list[str]:
        out = []
        for cls, plan in sorted(self.plans.items()):
            why = "; ".join(plan.reasons) or "nothing to do"
            out.append(f"{cls}: admit={plan.admit} evict={len(plan.evict)} free={plan.free_gpus} "
                       f"queued_fill={self.pending_fill.get(cls, 0)}: {why}")
        out += [f"submitted shard {s} on {c} as job {j}" for s, c, j in self.submitted]
        out += [f"signalled job {j} to checkpoint and requeue" for j in self.evicted]
        out += [f"shard {s}: {what}" for s, what in self.failed]
        out += [f"error: {e}" for e in self.errors]
        out.append(f"shards not yet submitted: {self.shards_left}; complete: {self.complete}; "
                   f"stalled: {len(self.stalled)}"
                   + (f" (out of retries: {', '.join(map(str, self.given_up))})" if self.given_up else ""))
        return out


def checkpoint_age(spec: FillShardSpec, now: float) -> Callable[[JobInfo], float]:
    """Work at risk of a running shard (:func:`ttsfleet.contracts.fill.work_at_risk`): since the
    later of its start and the last checkpoint its file names."""

    def age(job: JobInfo) -> float:
        ref = shard_of(job)
        state = spec.shard_state(ref.indices[0]) if ref and ref.indices else None
        return work_at_risk(now, job.start_time or None, state.last_checkpoint_at if state else None)

    return age


def shard_complete(spec: FillShardSpec, index: int) -> bool:
    """Whether the shard's checkpoint says complete (a missing or unreadable one does not)."""
    state = spec.shard_state(index)
    return state is not None and state.complete


class FillAgent:
    """Carries out :func:`plan_fill` on a Slurm cluster for one dataset's shards."""

    def __init__(self, backend: SlurmBackend, spec: FillShardSpec, policy: FillPolicyConfig,
                 ledger_path: str | Path, *, gpu_classes: list[str] | None = None,
                 clock: Callable[[], float] = time.time, collectors: Collectors | None = None,
                 signal_forget_s: float | None = None, retry: RetryPolicy | None = None) -> None:
        self.backend = backend
        self.spec = spec
        self.policy = policy
        self.ledger_path = Path(ledger_path)
        self.gpu_classes = gpu_classes
        self.clock = clock
        self.collectors = collectors
        self.retry = retry or RetryPolicy()
        # forget an eviction once the job had its grace time plus a margin to go
        self.signal_forget_s = signal_forget_s or (spec.grace_period_s + 60.0)

    def run_once(self) -> PassReport:
        report = PassReport()
        ledger = Ledger.load(self.ledger_path, self.spec.name, self.spec.shard_count)
        self.backend.ping()  # fails fast; squeue against a dead controller retries for ~10 s
        snapshot = take_snapshot(self.backend, self.clock)
        queued = self._reconcile(ledger, snapshot.jobs, report)
        # retries first: they carry partial progress; then shards never submitted
        todo = ledger.retry_due(self.clock(), self.retry) + ledger.untaken(queued)
        states = observe_classes(
            snapshot, fill_partition=self.spec.partition, fill_gpus_per_job=self.spec.gpus,
            seconds_since_checkpoint=checkpoint_age(self.spec, snapshot.t),
            signalled=set(ledger.signalled), fill_work_available=len(todo))
        for cls, state in states.items():
            if self.gpu_classes is not None and cls not in self.gpu_classes:
                continue
            plan = plan_fill(self.policy, _with_work(state, len(todo)))
            report.plans[cls] = plan
            report.pending_fill[cls] = state.pending_fill_jobs
            for job_id in plan.evict:
                self._evict(ledger, job_id, report)
            for _ in range(plan.admit):
                if not todo or report.errors:
                    break
                index = todo.pop(0)
                self._submit(ledger, index, cls, report)
        report.shards_left = len(ledger.untaken(queued))
        report.stalled = ledger.stalled()
        report.given_up = [i for i in report.stalled if self.retry.exhausted(ledger.shards[i].failures)]
        report.complete = sum(1 for e in ledger.shards.values() if e.state == "complete")
        ledger.save()
        self._export(report)
        return report

    def _export(self, report: PassReport) -> None:
        if self.collectors is None:
            return
        c, ds = self.collectors, self.spec.name
        c["slurm_fill_shards_stalled"].labels(dataset=ds).set(len(report.stalled))
        c["slurm_fill_shards_given_up"].labels(dataset=ds).set(len(report.given_up))
        c["slurm_fill_shard_failures"].labels(dataset=ds).inc(len(report.failed))

    # ---------------------------------------------------------------- steps
    def _reconcile(self, ledger: Ledger, jobs: tuple[JobInfo, ...], report: PassReport) -> set[int]:
        """Adopt live jobs of this dataset into the ledger, mark shards whose job ended without
        finishing them failed (or complete), and return the shards live jobs carry."""
        queued: set[int] = set()
        now = self.clock()
        by_id = {j.job_id: j for j in jobs}
        live = {j.job_id for j in jobs if j.live}
        for job in jobs:
            ref = shard_of(job)
            if not job.live or not ref or ref.dataset != ledger.dataset or ref.count != ledger.shard_count:
                continue
            for i in ref.indices:
                queued.add(i)
                entry = ledger.shards.get(i)
                if entry is None or entry.state != "submitted" or entry.job_id not in live:
                    ledger.shards[i] = ShardEntry("submitted", job.gpu_class or "?", now, job.job_id,
                                                  failures=entry.failures if entry else 0,
                                                  last_failure=entry.last_failure if entry else None)
        for i, entry in list(ledger.shards.items()):
            if entry.state in ("unconfirmed", "submitting") and i not in queued:
                # Slurm was unreachable when it was submitted (or the agent died submitting) and
                # the queue never showed it (finished jobs stay listed for MinJobAge): it was not
                # submitted. A retried shard goes back to failed, due at once.
                if entry.failures:
                    entry.state, entry.retry_at, entry.job_id = "failed", now, None
                else:
                    del ledger.shards[i]
            elif entry.state == "submitted" and i not in queued:
                self._job_ended(ledger, i, by_id.get(entry.job_id or ""), report, now)
        for job_id, at in list(ledger.signalled.items()):
            if job_id not in live or now - at > self.signal_forget_s:
                del ledger.signalled[job_id]
        return queued

    def _job_ended(self, ledger: Ledger, index: int, job: JobInfo | None, report: PassReport,
                   now: float) -> None:
        """The shard's job is no longer live: its shard is complete, or it failed."""
        entry = ledger.shards[index]
        if shard_complete(self.spec, index):
            entry.state, entry.retry_at = "complete", None
            return
        how = job.describe_end() if job is not None else "left the queue"
        if job is not None and (job.exit_signal == 9 or job.exit_code == 137):
            how += " (SIGKILL: out of memory?)"
        entry.state = "failed"
        entry.failures += 1
        entry.last_failure = f"job {entry.job_id} {how}"
        if self.retry.exhausted(entry.failures):
            entry.retry_at = None
            what = (f"{entry.last_failure} without finishing the shard; out of retries "
                    f"({entry.failures} failures): stalled until someone looks")
        else:
            delay = self.retry.delay(entry.failures)
            entry.retry_at = now + delay
            what = (f"{entry.last_failure} without finishing the shard; resubmitting in "
                    f"{delay:.3g} s (retry {entry.failures} of {self.retry.max_retries})")
        report.failed.append((index, what))
        log.warning("shard %d of %s: %s", index, ledger.dataset, what)

    def _submit(self, ledger: Ledger, index: int, cls: str, report: PassReport) -> None:
        before = ledger.shards.get(index)  # a failed shard being retried keeps its history
        history = {"failures": before.failures, "last_failure": before.last_failure} if before else {}
        ledger.shards[index] = ShardEntry("submitting", cls, self.clock(), **history)
        ledger.save()
        request = fill_submit_request(replace(self.spec, gpu_class=cls), index)
        try:
            job_id = self.backend.submit(request)
        except SubmitRejected as exc:
            # Slurm refused it: nothing was queued
            if before is not None:
                ledger.shards[index] = before
            else:
                del ledger.shards[index]
            report.errors.append(str(exc))
            return
        except SlurmUnavailable as exc:
            ledger.shards[index].state = "unconfirmed"
            report.errors.append(str(exc))
            return
        ledger.shards[index] = ShardEntry("submitted", cls, self.clock(), job_id, **history)
        ledger.save()
        report.submitted.append((index, cls, job_id))
        if self.collectors is not None:
            self.collectors["slurm_fill_submissions"].labels(gpu_class=cls).inc()
            if before is not None:
                self.collectors["slurm_fill_shard_retries"].labels(dataset=ledger.dataset).inc()
        log.info("submitted shard %d of %s on %s as job %s", index, ledger.dataset, cls, job_id)

    def _evict(self, ledger: Ledger, job_id: str, report: PassReport) -> None:
        try:
            self.backend.cancel(job_id, signal="USR1", batch_only=True)
        except SlurmUnavailable as exc:
            report.errors.append(str(exc))
            return
        ledger.signalled[job_id] = self.clock()
        report.evicted.append(job_id)

    def run_forever(self, interval_s: float, on_pass: Callable[[PassReport], None] | None = None) -> None:
        while True:
            try:
                report = self.run_once()
            except SlurmUnavailable as exc:
                report = PassReport(errors=[str(exc)])
            if on_pass:
                on_pass(report)
            time.sleep(interval_s)


def _with_work(state: ClassState, available: int):
    """The class observation with the shards still available (shared across classes)."""
    return replace(state.observation, fill_work_available=available)
