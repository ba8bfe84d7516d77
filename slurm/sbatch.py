"""sbatch scripts and submit requests for fill shards, rendered from ``fill-job.sbatch.tpl``.

One dataset (a fill manifest) is cut into ``shard_count`` shards; each shard is one Slurm job
(or one task of a job array) named ``ttsfleet-fill.<dataset>.<index>of<count>`` with the comment
``ttsfleet-fill:<dataset>:<index>/<count>``, so the fill agent recognises its shards in the queue
and never submits one twice. Shards share the output and checkpoint directories (the fill job
keeps one checkpoint file per shard there, :func:`ttsfleet.contracts.fill.checkpoint_file`), so a
requeued job resumes exactly where its checkpoint says.

The same template renders the hand-run example ``fill_jobs/slurm-fill.sh``
(:func:`render_example_script`; ``ttsfleet slurm render-sbatch --example``): one wrapper, one
argv builder (:func:`ttsfleet.contracts.fill.fill_argv`), one requeue code.
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

from ttsfleet.contracts import fill as contract
from ttsfleet.contracts.exits import PREEMPTED_REQUEUE
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
    grace_period_s: int = contract.GRACE_PERIOD_S
    dataset: str | None = None
    gpus: int = 1
    cpus: int = 1
    mem_mb: int | None = None
    stages: str | None = None
    item_delay_s: float | None = None
    checkpoint_every_items: int | None = None
    #: The policy's checkpoint interval, passed to every shard (None: the fill job's default).
    checkpoint_every_s: float | None = None
    fill_command: str | None = None

    def __post_init__(self) -> None:
        if self.shard_count < 1:
            raise UserError(f"shard count must be >= 1, got {self.shard_count}")
        if self.grace_period_s < 1:
            raise UserError(f"grace time must be >= 1 s, got {self.grace_period_s}")
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
        """The fill job's checkpoint of shard ``index`` (the contract's layout)."""
        return contract.checkpoint_file(self.checkpoint_root, index, self.shard_count)

    def shard_state(self, index: int) -> contract.ShardState | None:
        """What shard ``index``'s checkpoint says (None before its first checkpoint)."""
        return contract.shard_state(self.checkpoint_root, index, self.shard_count)


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


class Shell(str):
    """An argument the batch shell expands (``"$MANIFEST"``): written as it is, never quoted."""


def _words(argv: list[str]) -> str:
    """``fill run`` arguments as shell words, a flag and its value per continuation line."""
    words = [a if isinstance(a, Shell) else shlex.quote(a) for a in argv]
    pairs = [" ".join(words[i:i + 2]) for i in range(0, len(words), 2)]
    return "".join(f"\\\n    {pair} " for pair in pairs).rstrip()


def _render(**fields: object) -> str:
    tpl = Template(resources.files("ttsfleet.slurm").joinpath(TEMPLATE_NAME).read_text())
    return tpl.substitute(requeue_exit=PREEMPTED_REQUEUE, **fields)


AGENT_HEADER = """\
# ttsfleet fill shard under Slurm, rendered by ttsfleet.slurm.sbatch (`ttsfleet slurm render-sbatch`).
# The #SBATCH lines make this file submittable on its own (`sbatch FILE`); the fill agent passes
# the same options on the command line / in the REST request."""


def render_fill_script(spec: FillShardSpec, index: int | None = None, array: str | None = None) -> str:
    """The sbatch script of shard ``index``, or of a job array over ``array`` (e.g. ``0-7%2``)."""
    if (index is None) == (array is None):
        raise ValueError("give exactly one of index and array")
    if index is not None and not 0 <= index < spec.shard_count:
        raise UserError(f"shard index {index} outside 0..{spec.shard_count - 1}")
    argv = contract.fill_argv(
        manifest=str(spec.manifest), output=str(spec.output_root), checkpoint=str(spec.checkpoint_root),
        shard=Shell('"${SHARD_INDEX}/${SHARD_COUNT}"'), stages=spec.stages,
        checkpoint_every_s=spec.checkpoint_every_s, checkpoint_every_items=spec.checkpoint_every_items,
        item_delay_s=spec.item_delay_s)
    return _render(
        header=AGENT_HEADER, job_name=spec.job_name(index), partition=spec.partition,
        gres_comment=f"the GPU class is the GRES type: this shard runs only on {spec.gpu_class} GPUs",
        gres=f"gpu:{spec.gpu_class}:{spec.gpus}", cpus=spec.cpus, grace_period_s=spec.grace_period_s,
        output=str(Path(spec.log_dir) / ("%x-%A_%a.out" if array else "%x-%j.out")),
        comment_directive=f"#SBATCH --comment={spec.comment(index, array)}",
        array_directive=f"#SBATCH --array={array}" if array else "# (one shard, not an array)",
        preamble="", shard_index=index if index is not None else 0, shard_count=spec.shard_count,
        fill_command=spec.fill_command or default_fill_command(), fill_args=_words(argv))


EXAMPLE_HEADER = """\
# A fill job by hand under Slurm: one array task per shard, requeued when preempted.
#   MANIFEST=/shared/data/manifest.jsonl OUT=/shared/data/clean CKPT=/shared/ckpt/clean \\
#     sbatch --export=ALL slurm-fill.sh
# slurm.conf needs JobRequeue=1 (or --requeue below), RequeueExit={code} and, for the --signal
# warning at preemption, SlurmctldParameters=preempt_send_user_signal (`ttsfleet slurm
# render-conf` writes these lines). FILL_ARGS adds `fill run` options, TTSFLEET the command.
# Rendered by `ttsfleet slurm render-sbatch --example` from slurm/fill-job.sbatch.tpl, the
# template the fill agent's scripts come from: edit that, not this file."""


def render_example_script(shards: int = 8) -> str:
    """``fill_jobs/slurm-fill.sh``: the hand-run job array, from the agent's template. The shard
    comes from the array (``SLURM_ARRAY_TASK_ID`` / ``_COUNT``, read by the fill job itself)."""
    argv = contract.fill_argv(manifest=Shell('"$MANIFEST"'), output=Shell('"$OUT"'),
                              checkpoint=Shell('"$CKPT"'))
    return _render(
        header=EXAMPLE_HEADER.format(code=PREEMPTED_REQUEUE), job_name=JOB_PREFIX, partition="fill",
        gres_comment="any GPU; name the class as the GRES type (gpu:h200:1) to pin one", gres="gpu:1",
        cpus=1, grace_period_s=contract.GRACE_PERIOD_S, output=f"{JOB_PREFIX}-%A_%a.log",
        comment_directive="# (no --comment: the fill agent's shards carry one, a hand-run array does not)",
        array_directive=f"#SBATCH --array=0-{shards - 1}",
        preamble='\n: "${MANIFEST:?set MANIFEST}" "${OUT:?set OUT}" "${CKPT:?set CKPT}"\n',
        shard_index=0, shard_count="${SLURM_ARRAY_TASK_COUNT:-1}", fill_command="${TTSFLEET:-ttsfleet} fill",
        fill_args=_words(argv) + " ${FILL_ARGS:-}")  # FILL_ARGS: extra options, split by the shell


def fill_submit_request(spec: FillShardSpec, index: int | None = None,
                        array: str | None = None) -> SubmitRequest:
    """The :class:`SubmitRequest` for one shard (or an array), matching the script's #SBATCH lines."""
    script = render_fill_script(spec, index, array)
    return SubmitRequest(
        script=script, name=spec.job_name(index), partition=spec.partition,
        gres=f"gpu:{spec.gpu_class}:{spec.gpus}", cpus_per_task=spec.cpus, mem_mb=spec.mem_mb,
        requeue=True, signal=f"B:USR1@{spec.grace_period_s}", open_mode_append=True,
        output=str(Path(spec.log_dir) / ("%x-%A_%a.out" if array else "%x-%j.out")),
        array=array, workdir=spec.log_dir, comment=spec.comment(index, array))
