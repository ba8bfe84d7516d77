"""The fill-job loop: resume, clean items, commit in batches, stop on request, finish.

:func:`run_job` is what ``ttsfleet fill run`` calls. It holds the shard lock, resumes from the
checkpoint (removing orphans of an uncommitted batch, rebuilding the duplicate index from the
committed rows), and commits every ``checkpoint_every_items`` items or
``checkpoint_every_seconds`` seconds, whichever comes first. SIGTERM, SIGUSR1 and SIGINT set a
flag: the item in flight is abandoned at the next stage boundary, the batch is committed, the
checkpoint written, and the job returns :data:`~ttsfleet.contracts.exits.PREEMPTED_REQUEUE` (99).
A finished shard returns 0, also when started again.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from ttsfleet.fill_jobs import faults, registry
from ttsfleet.fill_jobs.batching import GroupRunner
from ttsfleet.fill_jobs.checkpoint import (
    ShardCheckpoint,
    ShardLock,
    load_checkpoint,
    save_checkpoint,
)
from ttsfleet.fill_jobs.events import EventLog
from ttsfleet.fill_jobs.manifest import Entry, ShardSpec, load_manifest
from ttsfleet.fill_jobs.outputs import OutputOwner, OutputShardLock, ShardOutput, bind_output
from ttsfleet.fill_jobs.pipeline import Abandoned, ItemResult, Pipeline
from ttsfleet.fill_jobs.prefetch import Prefetcher, worker_count
from ttsfleet.fill_jobs.settings import DEFAULT_STAGES, CleaningConfig
from ttsfleet.fill_jobs.stopping import StopFlag

from ttsfleet.contracts import fill as contract
from ttsfleet.contracts.exits import OK, PREEMPTED_REQUEUE
from ttsfleet.errors import UserError


@dataclass
class RunOptions:
    input: Path
    output: Path
    checkpoint: Path
    stages: tuple[str, ...] = DEFAULT_STAGES
    shard: ShardSpec = field(default_factory=ShardSpec)
    checkpoint_every_items: int = contract.CHECKPOINT_EVERY_ITEMS
    checkpoint_every_seconds: float = contract.CHECKPOINT_INTERVAL_S
    metrics_port: int | None = None
    #: Rewritten with the shard state after every checkpoint (the pod's termination message file).
    state_file: Path | None = None
    item_delay_seconds: float = 0.0
    config: CleaningConfig = field(default_factory=CleaningConfig)
    job_name: str | None = None
    interactive: bool | None = None

    @property
    def job(self) -> str:
        return self.job_name or f"{self.output.resolve().name}-{self.shard.index}of{self.shard.count}"


class _Metrics:
    """The job's fill_* collectors, started from the checkpoint's totals."""

    def __init__(self, job: str, ckpt: ShardCheckpoint, port: int | None, log: EventLog) -> None:
        from ttsfleet.metrics import make_collectors

        self.c = make_collectors("fill")
        self.job = job
        c = self.c
        c["fill_items_processed"].labels(job).inc(ckpt.items_done)
        for reason, n in ckpt.rejected.items():
            c["fill_items_rejected"].labels(job, reason).inc(n)
        c["fill_items_lost"].labels(job).inc(0)
        c["fill_audio_seconds_processed"].labels(job).inc(ckpt.audio_seconds)
        c["fill_checkpoints"].labels(job).inc(ckpt.checkpoints_written)
        c["fill_preemptions_survived"].labels(job).inc(ckpt.preemptions_survived)
        c["fill_items_total_in_manifest"].labels(job).set(ckpt.items_total)
        c["fill_batch_gpu_seconds"].labels(job).inc(0)
        self.gpu_seconds = 0.0
        c["fill_last_checkpoint_timestamp_seconds"].labels(job).set(ckpt.last_checkpoint_at)
        self.last_checkpoint = ckpt.last_checkpoint_at
        self.started = time.time()
        # The contract's work at risk: since the later of this run's start and its last commit.
        c["fill_seconds_since_checkpoint"].labels(job).set_function(
            lambda: contract.work_at_risk(time.time(), self.started, self.last_checkpoint))
        if port is not None:
            from prometheus_client import start_http_server

            try:
                start_http_server(port, registry=c.registry)
                log.emit("metrics", port=port)
            except OSError as exc:
                log.emit("metrics_unavailable", port=port, error=str(exc))

    def item(self, res: ItemResult) -> None:
        c, job = self.c, self.job
        c["fill_items_processed"].labels(job).inc()
        if not res.accepted:
            c["fill_items_rejected"].labels(job, res.reason).inc()
        c["fill_audio_seconds_processed"].labels(job).inc(res.audio_seconds)
        for stage, secs in res.stage_seconds.items():
            c["fill_stage_seconds"].labels(job, stage).observe(secs)

    def gpu_time(self, total: float | None) -> None:
        """The batch stages' device time so far (this process): the counter follows it."""
        if total is not None and total > self.gpu_seconds:
            self.c["fill_batch_gpu_seconds"].labels(self.job).inc(total - self.gpu_seconds)
            self.gpu_seconds = total

    def checkpointed(self, at: float) -> None:
        self.last_checkpoint = at
        self.c["fill_checkpoints"].labels(self.job).inc()
        self.c["fill_last_checkpoint_timestamp_seconds"].labels(self.job).set(at)

    def lost(self, n: int) -> None:
        self.c["fill_items_lost"].labels(self.job).inc(n)


def _check_resume(ckpt: ShardCheckpoint, fresh: ShardCheckpoint) -> None:
    for attr, what in (("manifest_sha256", "the manifest changed"), ("stages", "--stages differ"),
                       ("config_digest", "the cleaning config differs"),
                       ("items_total", "the shard's item count differs")):
        if getattr(ckpt, attr) != getattr(fresh, attr):
            raise UserError(f"cannot resume shard {ckpt.shard} from its checkpoint: {what}; use a "
                            "new --output/--checkpoint directory for a different job")


def _verify(rows: list[dict], entries: list[Entry]) -> int:
    """How many shard items are missing from or duplicated in ``rows`` (must be 0)."""
    want = [e.position for e in entries[: len(rows)]]
    got = [r["position"] for r in rows]
    if got == want:
        return 0
    from collections import Counter

    seen = Counter(got)
    return sum(1 for p in want if seen[p] != 1) + sum(n - 1 for n in seen.values() if n > 1)


class _Job:
    """One run of one shard (a process lifetime)."""

    def __init__(self, opts: RunOptions, log: EventLog, stop: StopFlag) -> None:
        self.opts = opts
        self.log = log
        self.stop = stop
        self.manifest = load_manifest(opts.input)
        self.entries = opts.shard.select(self.manifest.entries)
        self.output = ShardOutput(opts.output, opts.shard.name)
        self.ckpt_path = contract.checkpoint_file(opts.checkpoint, opts.shard.index, opts.shard.count)
        self.pending: list[ItemResult] = []
        self.batch_stages: list[tuple[str, object]] = []
        self._save_seconds = 0.0

    def _new_checkpoint(self) -> ShardCheckpoint:
        o = self.opts
        return ShardCheckpoint(job=o.job, manifest=str(o.input.resolve()),
                               manifest_sha256=self.manifest.sha256, shard_index=o.shard.index,
                               shard_count=o.shard.count, stages=list(o.stages),
                               config_digest=o.config.digest(), items_total=len(self.entries))

    def run(self) -> int:
        o = self.opts
        if not self.manifest.entries:
            raise UserError(f"manifest {o.input} has no items: nothing to clean")
        bind_output(o.output, OutputOwner(str(o.input.resolve()), self.manifest.sha256, o.shard.count,
                                          tuple(o.stages), o.config.digest()))
        with OutputShardLock(o.output, o.shard.name), ShardLock(o.checkpoint, o.shard.name):
            return self._run_locked()

    def _resume(self) -> ShardCheckpoint:
        fresh = self._new_checkpoint()
        ckpt = load_checkpoint(self.ckpt_path)
        if ckpt is None:
            return fresh
        _check_resume(ckpt, fresh)
        if ckpt.state != "complete" and ckpt.runs > 0:
            ckpt.preemptions_survived += 1
            if ckpt.state == "running":
                ckpt.hard_restarts += 1
        return ckpt

    def _run_locked(self) -> int:
        o = self.opts
        ckpt = self._resume()
        if ckpt.state == "complete":
            if not self.output.manifest_path.exists():
                raise UserError(f"checkpoint says shard {ckpt.shard} is complete but "
                                f"{self.output.manifest_path} is missing")
            self.output.remove_parts()
            self.log.emit("already_complete", shard=str(o.shard), items=ckpt.items_total)
            return OK
        removed = self.output.discard_uncommitted(ckpt.parts, (e.key for e in
                                                               self.entries[ckpt.items_done:]))
        try:
            rows = self.output.committed_rows(ckpt.parts)
        except FileNotFoundError as exc:
            raise UserError(f"output {o.output} does not match checkpoint {self.ckpt_path}: "
                            f"{exc} is missing") from None
        lost = _verify(rows, self.entries) + abs(len(rows) - ckpt.items_done)
        workers = worker_count(o.config) if not lost else 0
        pipeline = Pipeline(o.stages, o.config, self.stop.is_set, admit_only=workers > 0)
        for row in rows:
            pipeline.index.add_row(row)
        # The workers fork now, before CUDA, the batch stages or the metrics thread start here.
        prefetch = Prefetcher(o.stages, o.config, workers, local=None if workers else pipeline)
        try:
            self.batch_stages = [(n, registry.get(n).build()(o.config)) for n in o.stages
                                 if registry.get(n).kind == "batch"]
            ckpt.runs += 1
            ckpt.state = "running"
            save_checkpoint(self.ckpt_path, ckpt, self.opts.state_file)
            metrics = _Metrics(o.job, ckpt, o.metrics_port, self.log)
            if lost:
                metrics.lost(lost)
                raise UserError(f"{lost} committed item(s) missing or duplicated in {o.output}: the "
                                "output does not match its checkpoint")
            self.log.emit("started", shard=str(o.shard), items_total=ckpt.items_total,
                          items_done=ckpt.items_done, resumed=ckpt.runs > 1, orphans_removed=removed,
                          preemptions_survived=ckpt.preemptions_survived, stages=",".join(o.stages),
                          workers=workers)
            return self._loop(ckpt, pipeline, prefetch, metrics)
        finally:
            prefetch.close()
            self._release_batch_stages()

    def _loop(self, ckpt: ShardCheckpoint, pipeline: Pipeline, prefetch: Prefetcher,
              metrics: _Metrics) -> int:
        o = self.opts
        started = time.monotonic()
        last_commit = started
        # With batch stages, groups of batch_items are cut by shard position and commits fall on
        # group boundaries, so a restart forms the same groups (same batches, same outputs).
        group_size = o.config.batch_items if self.batch_stages else 1
        gpu = GroupRunner(self.batch_stages, should_stop=self.stop.is_set) if self.batch_stages else None
        todo = [(e, self.manifest.resolve(e.item.audio)) for e in self.entries[ckpt.items_done:]]
        group: list[ItemResult] = []
        self.log.start_progress(len(self.entries), ckpt.items_done)
        try:
            try:
                for pos, prep in enumerate(prefetch.iterate(todo), start=ckpt.items_done):
                    if self.stop.is_set():
                        break
                    if o.item_delay_seconds > 0 and self.stop.wait(o.item_delay_seconds):
                        break
                    group.append(pipeline.admit(prep, pos))
                    if len(group) == group_size or pos == len(self.entries) - 1:
                        if gpu is None:
                            self._take(group, metrics)
                        else:
                            gpu.submit(group)
                        group = []
                    for done in gpu.ready() if gpu is not None else ():
                        self._take(done, metrics)
                    now = time.monotonic()
                    if self.pending and (len(self.pending) >= o.checkpoint_every_items
                                         or now - last_commit >= o.checkpoint_every_seconds):
                        ckpt.active_seconds += now - started
                        started = last_commit = now
                        self._commit(ckpt, metrics)
            except Abandoned:
                pass
            for done in gpu.drain() if gpu is not None else ():  # finished GPU work is kept
                self._take(done, metrics)
            ckpt.active_seconds += time.monotonic() - started
            self._commit(ckpt, metrics)
        finally:
            if gpu is not None:
                gpu.close()
            self.log.stop_progress()
        if ckpt.items_done < len(self.entries):
            ckpt.state = "stopped"
            ckpt.orderly_stops += 1
            ckpt.last_stop_signal = self.stop.signal_name
            save_checkpoint(self.ckpt_path, ckpt, self.opts.state_file)
            metrics.checkpointed(ckpt.last_checkpoint_at)
            self.log.emit("preempted", signal=self.stop.signal_name, items_done=ckpt.items_done,
                          items_total=ckpt.items_total, exit_code=PREEMPTED_REQUEUE)
            return PREEMPTED_REQUEUE
        return self._finish(ckpt, metrics)

    def _take(self, group: list[ItemResult], metrics: _Metrics) -> None:
        """Stage a finished group's files; it joins the batch the next commit makes durable."""
        for res in group:
            for rel, data in res.files:
                self.output.stage_file(rel, data)
            res.clips = []
            self.pending.append(res)
            metrics.item(res)
            self.log.advance()
        metrics.gpu_time(self._gpu_seconds())

    def _gpu_seconds(self) -> float | None:
        secs = [s.gpu_seconds for _, s in self.batch_stages if hasattr(s, "gpu_seconds")]
        return round(sum(secs), 3) if secs else None

    def _release_batch_stages(self) -> None:
        """Drop the batch stages' models and give their device memory back before exiting."""
        if not self.batch_stages:
            return
        self.batch_stages = []
        import sys

        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_initialized():
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            self.log.emit("gpu_released", memory_reserved=torch.cuda.memory_reserved())

    def _commit(self, ckpt: ShardCheckpoint, metrics: _Metrics) -> None:
        if not self.pending:
            return
        t0 = time.monotonic()
        self.output.commit(ckpt.parts, [r.row for r in self.pending])
        faults.maybe_crash("after-part")
        ckpt.parts += 1
        ckpt.items_done += len(self.pending)
        for r in self.pending:
            if r.accepted:
                ckpt.accepted += 1
            else:
                ckpt.rejected[r.reason] = ckpt.rejected.get(r.reason, 0) + 1
            ckpt.audio_seconds = round(ckpt.audio_seconds + r.audio_seconds, 3)
        # Time to make outputs durable plus the checkpoint write (the previous one's duration:
        # this one cannot record its own).
        ckpt.commit_seconds += time.monotonic() - t0 + self._save_seconds
        t1 = time.monotonic()
        save_checkpoint(self.ckpt_path, ckpt, self.opts.state_file)
        self._save_seconds = time.monotonic() - t1
        metrics.checkpointed(ckpt.last_checkpoint_at)
        self.pending.clear()
        self.log.emit("checkpoint", items_done=ckpt.items_done, items_total=ckpt.items_total,
                      parts=ckpt.parts, rate=round(ckpt.rate_items_per_second or 0.0, 3),
                      audio_seconds=ckpt.audio_seconds, gpu_seconds=self._gpu_seconds())

    def _finish(self, ckpt: ShardCheckpoint, metrics: _Metrics) -> int:
        summary = {"job": ckpt.job, "shard": ckpt.shard, "manifest": ckpt.manifest,
                   "stages": ckpt.stages, "config_digest": ckpt.config_digest,
                   "items": ckpt.items_total, "accepted": ckpt.accepted,
                   "rejected": dict(sorted(ckpt.rejected.items())),
                   "input_audio_hours": round(ckpt.audio_seconds / 3600, 4)}
        rows = self.output.finalize(ckpt.parts)
        lost = _verify(rows, self.entries) + abs(len(rows) - len(self.entries))
        if lost:
            metrics.lost(lost)
            raise UserError(f"{lost} item(s) missing or duplicated in {self.output.manifest_path}")
        out_seconds = sum(o_["seconds"] for r in rows for o_ in r["outputs"])
        summary["output_audio_hours"] = round(out_seconds / 3600, 4)
        self.output.write_summary(summary)
        faults.maybe_crash("after-manifest")
        ckpt.state = "complete"
        save_checkpoint(self.ckpt_path, ckpt, self.opts.state_file)
        self.output.remove_parts()
        self.log.emit("complete", items=ckpt.items_total, accepted=ckpt.accepted,
                      rejected=sum(ckpt.rejected.values()), preemptions_survived=ckpt.preemptions_survived,
                      manifest=str(self.output.manifest_path))
        return OK


def run_job(opts: RunOptions, stop: StopFlag | None = None) -> int:
    """Run (or resume) one shard; returns the process exit code (0 done, 99 requeue me).

    ``stop``: an installed :class:`StopFlag` (the CLI installs one before its heavy imports);
    without one, the stop signals are routed to a new flag here.
    """
    if opts.checkpoint_every_items < 1 or opts.checkpoint_every_seconds <= 0:
        raise UserError("checkpoint intervals must be positive")
    if opts.item_delay_seconds < 0:
        raise UserError("--item-delay-seconds must be >= 0")
    log = EventLog(opts.job, opts.interactive)
    return _Job(opts, log, stop or StopFlag().install()).run()
