"""``ttsfleet fill ...``: run a fill job, show its progress, make a test corpus.

Heavy imports (torch, silero, soundfile) happen inside the commands so ``ttsfleet --help`` stays
fast. ``run`` exits 0 when its shard is complete and 99 (``PREEMPTED_REQUEUE``) after an orderly
stop on SIGTERM/SIGUSR1/SIGINT; bad input raises :class:`~ttsfleet.errors.UserError` (exit 2,
one line): a manifest with no items, a checkpoint that is not one, an output directory another
fill job owns or whose files disagree with the checkpoint, a full disk.
"""

from __future__ import annotations

import json
from pathlib import Path

import typer

from ttsfleet.contracts import fill as contract
from ttsfleet.errors import UserError

app = typer.Typer(no_args_is_help=True, add_completion=False)


@app.command("run")
def run(
    input: Path = typer.Option(..., "--input", "-i",
                               help="JSONL manifest (audio, text, speaker, language, id)"),
    output: Path = typer.Option(..., "--output", "-o", help="output directory (shared by all shards)"),
    checkpoint: Path = typer.Option(..., "--checkpoint", "-c",
                                    help="checkpoint directory (a PVC or shared filesystem path)"),
    stages: str = typer.Option("default", "--stages",
                               help="comma-separated stages (ttsfleet fill stages lists them); "
                                    "'default' = the starred ones; 'fast' = decode,hash"),
    shard: str | None = typer.Option(None, "--shard",
                                     help=f"I/N: this job's shard. Without it: {contract.SHARD_ENV}, or "
                                          "SLURM_ARRAY_TASK_ID/COUNT, or JOB_COMPLETION_INDEX with "
                                          f"{contract.SHARDS_ENV}, else 0/1"),
    checkpoint_every_items: int = typer.Option(contract.CHECKPOINT_EVERY_ITEMS,
                                               help="commit after this many items ..."),
    checkpoint_every_seconds: float = typer.Option(contract.CHECKPOINT_INTERVAL_S,
                                                   help="... or this many seconds"),
    metrics_port: int | None = typer.Option(None, envvar=contract.METRICS_PORT_ENV,
                                            help="serve Prometheus metrics on this port"),
    state_file: Path | None = typer.Option(None, envvar=contract.STATE_FILE_ENV,
                                           help="rewrite this file with the shard state after every "
                                                "checkpoint (a pod's termination message file)"),
    item_delay_seconds: float = typer.Option(0.0, help="sleep per item (tests and demos of preemption)"),
    config: Path | None = typer.Option(None, "--config", help="YAML/JSON cleaning thresholds"),
    job_name: str | None = typer.Option(None, envvar=contract.JOB_ENV,
                                        help="fill_job label of the metrics (default: output dir + shard)"),
) -> None:
    """Clean one shard of a manifest; resumable, exits 99 when preempted."""
    from ttsfleet.fill_jobs.stopping import StopFlag

    stop = StopFlag().install()  # before the heavy imports: a start-up preemption also stops cleanly
    from ttsfleet.fill_jobs.manifest import ShardSpec, parse_shard, shard_from_environment
    from ttsfleet.fill_jobs.runner import RunOptions, run_job
    from ttsfleet.fill_jobs.settings import load_config, parse_stages

    spec = parse_shard(shard) if shard else (shard_from_environment() or ShardSpec())
    opts = RunOptions(input=input, output=output, checkpoint=checkpoint, stages=parse_stages(stages),
                      shard=spec, checkpoint_every_items=checkpoint_every_items,
                      checkpoint_every_seconds=checkpoint_every_seconds, metrics_port=metrics_port,
                      state_file=state_file,
                      item_delay_seconds=item_delay_seconds, config=load_config(config),
                      job_name=job_name)
    try:
        code = run_job(opts, stop)
    finally:
        stop.ignore_at_exit()
    if code:
        raise SystemExit(code)


@app.command("status")
def status(
    checkpoint: Path = typer.Option(..., "--checkpoint", "-c", help="checkpoint directory"),
    as_json: bool = typer.Option(False, "--json", help="machine-readable output"),
) -> None:
    """Progress of every shard in a checkpoint directory: items, rate, ETA, preemptions."""
    from ttsfleet.fill_jobs.status import print_table, status_report

    report = status_report(checkpoint)
    if as_json:
        typer.echo(json.dumps(report, indent=2))
    else:
        print_table(report)


@app.command("merge")
def merge_cmd(
    output: Path = typer.Option(..., "--output", "-o", help="the job's output directory"),
    config: Path | None = typer.Option(None, "--config", help="the cleaning config the job used"),
) -> None:
    """Combine finished shards into manifest.jsonl, rejecting duplicates across shards."""
    from ttsfleet.fill_jobs.merge import merge
    from ttsfleet.fill_jobs.settings import load_config

    summary = merge(output, load_config(config))
    typer.echo(json.dumps({k: v for k, v in summary.items() if k != "unreferenced_audio"}))


@app.command("corpus")
def corpus(
    directory: Path = typer.Argument(..., help="where to write wav/ and manifest.jsonl"),
    items: int = typer.Option(20, "--items", "-n", min=0, help="number of utterances"),
    seed: int = typer.Option(0, help="same seed, same corpus"),
    mixed: bool = typer.Option(False, help="add faulty variants (noise, clipping, duplicates, ...)"),
) -> None:
    """Synthesize a small speech corpus with espeak-ng (for tests and demos)."""
    from ttsfleet.fill_jobs.corpus import make_corpus, make_mixed_corpus

    if mixed:
        path, _ = make_mixed_corpus(directory, seed=seed, n_clean=items)
    else:
        path = make_corpus(directory, items, seed=seed)
    typer.echo(str(path))


@app.command("render-example")
def render_example(shards: int = typer.Option(8, "--shards", min=1, help="pods (one shard each)")) -> None:
    """Print the hand-run Kubernetes Indexed Job (``fill_jobs/k8s-indexed-job.yaml``)."""
    from ttsfleet.fill_jobs.examples import render_kubernetes_example

    typer.echo(render_kubernetes_example(shards), nl=False)


@app.command("stages")
def stages_cmd() -> None:
    """List the cleaning stages in the order they run."""
    from ttsfleet.fill_jobs import registry

    for name in registry.names():
        stage = registry.get(name)
        typer.echo(f"{'*' if stage.default else ' '} {name:9s} {stage.help}")


__all__ = ["app", "UserError"]
