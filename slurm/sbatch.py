"""sbatch scripts and submit requests for fill shards, rendered from ``fill-job.sbatch.tpl``.

One dataset (a fill manifest) is cut into ``shard_count`` shards; each shard is one Slurm job
(or one task of a job array) named ``ttsfleet-fill.<dataset>.<index>of<count>`` with the comment
``ttsfleet-fill:<dataset>:<index>/<count>``, so the fill agent recognises its shards in the queue
and never submits one twice. Shards share the output and checkpoint directories (the fill job
keeps one checkpoint file per shard there), so a
requeued job resumes exactly where its checkpoint says.
"""

from __future__ import annotations

import re
import shlex
import sys
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from string import Template

from ttsfleet.slurm.backend import JobInfo, SubmitRequest

from ttsfleet.errors import UserError

TEMPLATE_NAME = "fill-job.sbatch.tpl"
JOB_PREFIX = "ttsfleet-fill"
_COMMENT = re.compile(rf"^{JOB_PREFIX}:(?P<dataset>[\w.-]+):(?P<index>\d+|\d+-\d+)/(?P<count>\d+)$")


def default_fill_command() -> str:
    """The fill CLI as this interpreter runs it (works without the console script on PATH)."""
    return f"{shlex.quote(sys.executable)} -m ttsfleet.cli fill"


def dataset_name(manifest: str | Path) -> str:
    """A job-name-safe dataset name from a manifest path (``/data/en-v2.jsonl`` → ``en-v2``)."""
    stem = Path(manifest).name.split(".")[0] or "dataset"
    return re.sub(r"[^\w.-]", "-", stem)


@dataclass(frozen=True)
class FillShardSpec:
    """Everything that defines the fill shards of one dataset on one GPU class."""

    manifest: str
    output_root: str
    checkpoint_root: str
    shard_count: int
    gpu_class: str
    log_dir: str
    partition: str = "fill"
    grace_time_s: int = 60
    dataset: str | None = None
    gpus: int = 1
    cpus: int = 1
    mem_mb: int | None = None
    stages: str | None = None
    item_delay_s: float | None = None
    checkpoint_every_items: int | None = None
    fill_command: str | None = None

    def __post_init__(self) -> None:
        if self.shard_count < 1:
            raise UserError(f"shard count must be >= 1, got {self.shard_count}")
        if self.grace_time_s < 1:
            raise UserError(f"grace time must be >= 1 s, got {self.grace_time_s}")
        if not re.fullmatch(r"[a-z0-9][a-z0-9-]*", self.gpu_class):
            raise UserError(f"GPU class must look like 'h200', got {self.gpu_class!r}")
        if self.dataset is not None and not re.fullmatch(r"[\w.-]+", self.dataset):
            raise UserError(f"dataset name may hold letters, digits, '.', '_', '-': {self.dataset!r}")

    @property
    def name(self) -> str:
        return self.dataset or dataset_name(self.manifest)

    def job_name(self, index: int | None) -> str:
        return f"{JOB_PREFIX}.{self.name}." + (f"{index}of{self.shard_count}" if index is not None
                                                 else f"array-of{self.shard_count}")

    def comment(self, index: int | None, array: str | None = None) -> str:
        part = str(index) if index is not None else (array or f"0-{self.shard_count - 1}")
        return f"{JOB_PREFIX}:{self.name}:{part.split('%')[0]}/{self.shard_count}"

    def checkpoint_file(self, index: int) -> Path:
        """The fill job's checkpoint of shard ``index`` (``ttsfleet.fill_jobs.checkpoint`` layout)."""
        return Path(self.checkpoint_root) / f"shard-{index:04d}-of-{self.shard_count:04d}.json"


@dataclass(frozen=True)
class ShardRef:
    """Which dataset shard(s) a queued job works on, read back from its comment."""

    dataset: str
    indices: tuple[int, ...]
    count: int


def shard_of(job: JobInfo) -> ShardRef | None:
    """The shard a job carries (array tasks resolve to their own index), or None if not a fill job."""
    m = _COMMENT.match(job.comment.strip())
    if not m:
        return None
    lo, _, hi = m.group("index").partition("-")
    if job.array_task_id is not None:
        indices: tuple[int, ...] = (job.array_task_id,)
    else:
        indices = tuple(range(int(lo), int(hi or lo) + 1))
    return ShardRef(m.group("dataset"), indices, int(m.group("count")))


def _extra_args(spec: FillShardSpec) -> str:
    pairs = []
    if spec.stages:
        pairs.append(("--stages", spec.stages))
    if spec.item_delay_s is not None:
        pairs.append(("--item-delay-seconds", str(spec.item_delay_s)))
    if spec.checkpoint_every_items is not None:
        pairs.append(("--checkpoint-every-items", str(spec.checkpoint_every_items)))
    return "".join(f" \\\n    {flag} {shlex.quote(value)}" for flag, value in pairs)


def render_fill_script(spec: FillShardSpec, index: int | None = None, array: str | None = None) -> str:
    """The sbatch script of shard ``index``, or of a job array over ``array`` (e.g. ``0-7%2``)."""
    if (index is None) == (array is None):
        raise ValueError("give exactly one of index and array")
    if index is not None and not 0 <= index < spec.shard_count:
        raise UserError(f"shard index {index} outside 0..{spec.shard_count - 1}")
    tpl = Template(resources.files("ttsfleet.slurm").joinpath(TEMPLATE_NAME).read_text())
    output = str(Path(spec.log_dir) / ("%x-%A_%a.out" if array else "%x-%j.out"))
    return tpl.substitute(
        job_name=spec.job_name(index), partition=spec.partition, gpu_class=spec.gpu_class,
        gpus=spec.gpus, cpus=spec.cpus, grace_time_s=spec.grace_time_s, output=output,
        comment=spec.comment(index, array),
        array_directive=f"#SBATCH --array={array}" if array else "# (one shard, not an array)",
        shard_index=index if index is not None else 0, shard_count=spec.shard_count,
        fill_command=spec.fill_command or default_fill_command(),
        manifest=shlex.quote(str(spec.manifest)), output_root=shlex.quote(str(spec.output_root)),
        checkpoint_root=shlex.quote(str(spec.checkpoint_root)), extra_args=_extra_args(spec))


def fill_submit_request(spec: FillShardSpec, index: int | None = None,
                        array: str | None = None) -> SubmitRequest:
    """The :class:`SubmitRequest` for one shard (or an array), matching the script's #SBATCH lines."""
    script = render_fill_script(spec, index, array)
    return SubmitRequest(
        script=script, name=spec.job_name(index), partition=spec.partition,
        gres=f"gpu:{spec.gpu_class}:{spec.gpus}", cpus_per_task=spec.cpus, mem_mb=spec.mem_mb,
        requeue=True, signal=f"B:USR1@{spec.grace_time_s}", open_mode_append=True,
        output=str(Path(spec.log_dir) / ("%x-%A_%a.out" if array else "%x-%j.out")),
        array=array, workdir=spec.log_dir, comment=spec.comment(index, array))
