"""``ttsfleet slurm ...`` commands: validate and render config, render/submit fill shards, run the
fill agent and the exporter, and bring up a local test cluster.

Heavy or Slurm-touching imports live inside the commands. Slurm failures are
:class:`~ttsfleet.slurm.backend.SlurmError` (a :class:`~ttsfleet.errors.UserError`): one line on
stderr, exit 2.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer

from ttsfleet.contracts import fill as fill_contract
from ttsfleet.errors import UserError

app = typer.Typer(no_args_is_help=True, add_completion=False)

BACKEND_HELP = ("cli: Slurm's commands on this host; rest: slurmrestd at --rest-url; pyslurm: the "
                "Slurm C API (Slurm 25.11 with pyslurm installed)")


def _backend(backend: str, slurm_conf: Path | None, rest_url: str | None, rest_user: str | None,
             rest_token: str | None):
    if backend == "cli":
        from ttsfleet.slurm.cli_backend import CliBackend

        if slurm_conf is not None and not slurm_conf.is_file():
            raise UserError(f"--slurm-conf {slurm_conf}: no such file")
        return CliBackend(str(slurm_conf) if slurm_conf else None)
    if backend == "rest":
        from ttsfleet.slurm.rest_backend import RestBackend

        if not rest_url:
            raise UserError("--backend rest needs --rest-url (unix:/path/to/socket or http://host:port)")
        return RestBackend(rest_url, user=rest_user, token=rest_token)
    if backend == "pyslurm":
        from ttsfleet.slurm.pyslurm_backend import PyslurmBackend

        return PyslurmBackend(str(slurm_conf) if slurm_conf else None)
    raise UserError(f"unknown backend {backend!r} (cli, rest or pyslurm)")


def _catalog(catalog_file: Path | None):
    """The run's GPU catalog: ``--catalog FILE`` or the built-in one (a bad file: one line, exit 2)."""
    from ttsfleet.catalog import GpuCatalog

    return GpuCatalog.load(catalog_file)


def _gpu_class(name: str | None, catalog_file: Path | None) -> str:
    """A GPU class of the run's catalog; with none given, the catalog's only class."""
    names = _catalog(catalog_file).names()
    if name is None:
        if len(names) == 1:
            return names[0]
        raise UserError(f"--gpu-class is required: the catalog has {', '.join(names)}")
    if name not in names:
        raise UserError(f"unknown GPU class {name!r}: the catalog has {', '.join(names)}")
    return name


_GPU_CLASS = typer.Option(None, "--gpu-class", help="GPU class (a GRES type) from the GPU catalog")
_CATALOG = typer.Option(None, "--catalog", help="GPU catalog file (default: the built-in catalog)")
_BACKEND = typer.Option("cli", "--backend", envvar="TTSFLEET_SLURM_BACKEND", help=BACKEND_HELP)
_CONF = typer.Option(None, "--slurm-conf", envvar="SLURM_CONF", help="slurm.conf for the cli backend")
_REST_URL = typer.Option(None, "--rest-url", envvar="TTSFLEET_SLURMRESTD_URL",
                         help="slurmrestd: unix:/path or http://host:port")
_REST_USER = typer.Option(None, "--rest-user", envvar="SLURM_USER_NAME", help="JWT user for slurmrestd")
_REST_TOKEN = typer.Option(None, "--rest-token", envvar="SLURM_JWT", help="JWT for slurmrestd")


@app.command("validate-conf")
def validate_conf(
    path: Path = typer.Argument(..., help="the site's slurm.conf"),
    fill_partition: str = typer.Option("fill", help="name of the fill partition"),
    train_partition: str = typer.Option("train", help="name of the training partition"),
    strict: bool = typer.Option(False, help="treat warnings as errors"),
    catalog: Path | None = typer.Option(None, "--catalog",
                                        help="GPU catalog file: its classes are the valid GRES types"),
) -> None:
    """Check a slurm.conf for the settings fill work depends on (exit 2 on errors)."""
    from ttsfleet.slurm.validate import validate_file

    findings = validate_file(str(path), _catalog(catalog), fill_partition=fill_partition,
                             train_partition=train_partition)
    for f in findings:
        typer.echo(f.format(str(path)), err=True)
    errors = [f for f in findings if f.severity == "error" or strict]
    if errors:
        raise UserError(f"{path}: {len(errors)} problem(s) make it unsafe for fill work "
                        f"(first: {errors[0].message})")
    typer.echo(f"{path}: ok for fill work ({len(findings)} warning(s))")


@app.command("render-conf")
def render_conf(
    nodes: str = typer.Option(..., help="hostlist of the GPU nodes, e.g. gpu-h200-[01-04]"),
    grace_period_s: int = typer.Option(fill_contract.GRACE_PERIOD_S, "--grace-time", min=1,
                                       help="fill GraceTime, seconds"),
    cred_expire_s: int = typer.Option(30, "--cred-expire", min=1,
                                      help="requeue delay (AuthInfo cred_expire), seconds"),
    fill_partition: str = typer.Option("fill"),
    train_partition: str = typer.Option("train"),
) -> None:
    """Print the commented slurm.conf lines for the train and fill partitions."""
    from ttsfleet.slurm.conf import render_fill_conf

    typer.echo(render_fill_conf(nodes=nodes, grace_period_s=grace_period_s, cred_expire_s=cred_expire_s,
                                fill_partition=fill_partition, train_partition=train_partition), nl=False)


def _spec(manifest: Path, output: Path, checkpoint: Path, shards: int, gpu_class: str, log_dir: Path | None,
          partition: str, grace_period_s: int, stages: str | None, item_delay_seconds: float | None,
          checkpoint_every_items: int | None, fill_command: str | None, cpus: int,
          dataset: str | None = None, mem_mb: int | None = None,
          checkpoint_every_s: float = fill_contract.CHECKPOINT_INTERVAL_S):
    from ttsfleet.slurm.sbatch import FillShardSpec

    if not manifest.is_file():
        raise UserError(f"manifest {manifest} not found")
    return FillShardSpec(
        manifest=str(manifest.resolve()), output_root=str(output.resolve()),
        checkpoint_root=str(checkpoint.resolve()), shard_count=shards, gpu_class=gpu_class,
        log_dir=str((log_dir or output / "slurm-logs").resolve()), partition=partition,
        grace_period_s=grace_period_s, stages=stages, item_delay_s=item_delay_seconds,
        checkpoint_every_items=checkpoint_every_items, checkpoint_every_s=checkpoint_every_s,
        fill_command=fill_command, cpus=cpus, dataset=dataset, mem_mb=mem_mb)


_MANIFEST = typer.Option(..., "--input", "--manifest", help="fill manifest (JSONL)")
_OUTPUT = typer.Option(..., "--output", help="output directory shared by all shards")
_CKPT = typer.Option(..., "--checkpoint", help="checkpoint directory shared by all shards")
_SHARDS = typer.Option(..., "--shards", min=1, help="number of shards the dataset is cut into")
_LOGS = typer.Option(None, "--log-dir", help="Slurm job logs (default OUTPUT/slurm-logs)")
_PARTITION = typer.Option("fill", "--partition")
_GRACE = typer.Option(fill_contract.GRACE_PERIOD_S, "--grace-time", min=1,
                      help="the fill partition's GraceTime, seconds")
_STAGES = typer.Option(None, "--stages", help="fill stages, e.g. decode,hash")
_DELAY = typer.Option(None, "--item-delay-seconds", help="fill job: sleep per item (demos/tests)")
_EVERY = typer.Option(None, "--checkpoint-every-items", help="fill job: commit after N items")
_EVERY_S = typer.Option(fill_contract.CHECKPOINT_INTERVAL_S, "--checkpoint-every-seconds",
                        help="fill job: commit at least this often (the policy's checkpoint interval)")
_FILL_CMD = typer.Option(None, "--fill-command",
                         help="how nodes run the fill CLI (default: this python -m ttsfleet.cli fill)")
_CPUS = typer.Option(1, "--cpus", min=1, help="CPUs per fill shard")
_MEM = typer.Option(None, "--mem-mb", min=1, help="memory per fill shard, MB (default: partition's)")


@app.command("render-sbatch")
def render_sbatch(
    manifest: Path = _MANIFEST, output: Path = _OUTPUT, checkpoint: Path = _CKPT,
    shards: int = _SHARDS, gpu_class: str | None = _GPU_CLASS, catalog: Path | None = _CATALOG,
    shard: int | None = typer.Option(None, "--shard", help="one shard index (default: job array)"),
    array_limit: int | None = typer.Option(None, "--array-limit", help="at most N array tasks at once"),
    log_dir: Path | None = _LOGS, partition: str = _PARTITION, grace_period_s: int = _GRACE,
    stages: str | None = _STAGES, item_delay_seconds: float | None = _DELAY,
    checkpoint_every_items: int | None = _EVERY, fill_command: str | None = _FILL_CMD, cpus: int = _CPUS,
    checkpoint_every_s: float = _EVERY_S,
) -> None:
    """Print the sbatch script of one fill shard, or of a job array over all shards."""
    from ttsfleet.slurm.sbatch import render_fill_script

    spec = _spec(manifest, output, checkpoint, shards, _gpu_class(gpu_class, catalog), log_dir, partition,
                 grace_period_s, stages, item_delay_seconds, checkpoint_every_items, fill_command, cpus,
                 checkpoint_every_s=checkpoint_every_s)
    array = None if shard is not None else f"0-{shards - 1}" + (f"%{array_limit}" if array_limit else "")
    typer.echo(render_fill_script(spec, shard, array), nl=False)


@app.command("render-example")
def render_example(shards: int = typer.Option(8, "--shards", min=1,
                                              help="array tasks (one shard each)")) -> None:
    """Print the hand-run job array ``fill_jobs/slurm-fill.sh``, from the fill agent's template."""
    from ttsfleet.slurm.sbatch import render_example_script

    typer.echo(render_example_script(shards), nl=False)


@app.command("submit-array")
def submit_array(
    manifest: Path = _MANIFEST, output: Path = _OUTPUT, checkpoint: Path = _CKPT,
    shards: int = _SHARDS, gpu_class: str | None = _GPU_CLASS, catalog: Path | None = _CATALOG,
    array_limit: int | None = typer.Option(None, "--array-limit", help="at most N array tasks at once"),
    log_dir: Path | None = _LOGS, partition: str = _PARTITION, grace_period_s: int = _GRACE,
    stages: str | None = _STAGES, item_delay_seconds: float | None = _DELAY,
    checkpoint_every_items: int | None = _EVERY, fill_command: str | None = _FILL_CMD, cpus: int = _CPUS,
    mem_mb: int | None = _MEM, backend: str = _BACKEND, slurm_conf: Path | None = _CONF,
    rest_url: str | None = _REST_URL,
    rest_user: str | None = _REST_USER, rest_token: str | None = _REST_TOKEN,
    checkpoint_every_s: float = _EVERY_S,
) -> None:
    """Submit all shards at once as one job array (no agent: Slurm fills idle GPUs by itself)."""
    from ttsfleet.slurm.sbatch import fill_submit_request

    spec = _spec(manifest, output, checkpoint, shards, _gpu_class(gpu_class, catalog), log_dir, partition,
                 grace_period_s, stages, item_delay_seconds, checkpoint_every_items, fill_command, cpus,
                 mem_mb=mem_mb, checkpoint_every_s=checkpoint_every_s)
    Path(spec.log_dir).mkdir(parents=True, exist_ok=True)
    array = f"0-{shards - 1}" + (f"%{array_limit}" if array_limit else "")
    job_id = _backend(backend, slurm_conf, rest_url, rest_user, rest_token).submit(
        fill_submit_request(spec, array=array))
    typer.echo(job_id)


@app.command("fill-agent")
def fill_agent(
    manifest: Path = _MANIFEST, output: Path = _OUTPUT, checkpoint: Path = _CKPT,
    shards: int = _SHARDS,
    dataset: str | None = typer.Option(None, "--dataset",
                                       help="name that identifies the shards in the queue (default: "
                                            "the manifest's file name)"),
    state: Path = typer.Option(..., "--state", help="the agent's shard ledger (JSON), kept across runs"),
    gpu_class: list[str] = typer.Option(None, "--gpu-class", help="only these classes (default: all)"),
    catalog: Path | None = _CATALOG,
    max_retries: int = typer.Option(3, "--max-retries", min=0,
                                    help="resubmit a shard whose job failed (SIGKILL/OOM, full disk, "
                                         "...) at most this often"),
    retry_backoff_s: float = typer.Option(30.0, "--retry-backoff", min=0.0,
                                          help="seconds before the first resubmission; doubles each time"),
    once: bool = typer.Option(False, "--once", help="one decision pass, then exit"),
    interval_s: float = typer.Option(15.0, "--interval", min=0.1, help="seconds between passes"),
    min_free_gpus: int = typer.Option(0, "--min-free-gpus", min=0, help="GPUs per class left empty"),
    max_fill_gpus: int | None = typer.Option(None, "--max-fill-gpus", min=0, help="cap per class"),
    hold: bool = typer.Option(True, "--hold-while-training-pending/--no-hold",
                              help="admit no fill while training waits"),
    metrics_port: int | None = typer.Option(None, "--metrics-port", help="serve agent metrics here"),
    as_json: bool = typer.Option(False, "--json", help="print each pass as JSON"),
    log_dir: Path | None = _LOGS, partition: str = _PARTITION, grace_period_s: int = _GRACE,
    stages: str | None = _STAGES, item_delay_seconds: float | None = _DELAY,
    checkpoint_every_items: int | None = _EVERY, fill_command: str | None = _FILL_CMD, cpus: int = _CPUS,
    mem_mb: int | None = _MEM, backend: str = _BACKEND, slurm_conf: Path | None = _CONF,
    rest_url: str | None = _REST_URL,
    rest_user: str | None = _REST_USER, rest_token: str | None = _REST_TOKEN,
    checkpoint_every_s: float = _EVERY_S,
) -> None:
    """Keep idle fill-partition GPUs busy with dataset shards, decided by ttsfleet.policy.plan_fill."""
    from dataclasses import asdict

    from ttsfleet.slurm.agent import FillAgent
    from ttsfleet.slurm.ledger import RetryPolicy

    from ttsfleet.config import FillPolicyConfig
    from ttsfleet.metrics import make_collectors

    classes = [_gpu_class(c, catalog) for c in gpu_class or ()]
    # the spec's class is a placeholder: each submission carries the class the policy admitted it on
    placeholder = classes[0] if classes else _catalog(catalog).names()[0]
    spec = _spec(manifest, output, checkpoint, shards, placeholder, log_dir,
                 partition, grace_period_s, stages, item_delay_seconds, checkpoint_every_items,
                 fill_command, cpus, dataset, mem_mb, checkpoint_every_s)
    for d in (spec.log_dir, spec.output_root, spec.checkpoint_root):
        Path(d).mkdir(parents=True, exist_ok=True)
    # Slurm's partition_prio preempts fill for training itself: the policy evicts only for headroom.
    policy = FillPolicyConfig(min_free_gpus=min_free_gpus, max_fill_gpus=max_fill_gpus,
                              hold_while_training_pending=hold, grace_period_s=float(grace_period_s),
                              checkpoint_interval_s=checkpoint_every_s, scheduler_preempts_training=True)
    collectors = make_collectors("slurm")
    if metrics_port is not None:
        from prometheus_client import start_http_server

        start_http_server(metrics_port, registry=collectors.registry)
    retry = RetryPolicy(max_retries=max_retries, backoff_s=retry_backoff_s,
                        max_backoff_s=max(retry_backoff_s, RetryPolicy.max_backoff_s))
    agent = FillAgent(_backend(backend, slurm_conf, rest_url, rest_user, rest_token), spec, policy, state,
                      gpu_classes=classes or None, collectors=collectors, retry=retry)

    def show(report) -> None:
        if as_json:
            plans = {k: asdict(v) for k, v in report.plans.items()}
            typer.echo(json.dumps({"plans": plans, "pending_fill": report.pending_fill,
                                   "submitted": report.submitted, "evicted": report.evicted,
                                   "errors": report.errors, "shards_left": report.shards_left,
                                   "failed": report.failed, "stalled": report.stalled,
                                   "given_up": report.given_up, "complete": report.complete}))
        else:
            for line in report.lines():
                typer.echo(line)
        sys.stdout.flush()

    if once:
        report = agent.run_once()
        show(report)
        if report.errors:
            raise UserError(report.errors[0])
        return
    agent.run_forever(interval_s, on_pass=show)


@app.command("exporter")
def exporter(
    port: int = typer.Option(9108, "--port", help="serve /metrics on this port"),
    address: str = typer.Option("0.0.0.0", "--address"),
    interval_s: float = typer.Option(15.0, "--interval", min=0.1, help="seconds between Slurm polls"),
    once: bool = typer.Option(False, "--once", help="poll once and print the metrics to stdout"),
    fill_partition: str = typer.Option("fill", "--fill-partition"),
    backend: str = _BACKEND, slurm_conf: Path | None = _CONF, rest_url: str | None = _REST_URL,
    rest_user: str | None = _REST_USER, rest_token: str | None = _REST_TOKEN,
) -> None:
    """Prometheus metrics: GPUs allocated/idle per partition and class, jobs, preemptions, requeues."""
    import time

    from ttsfleet.slurm.exporter import SlurmExporter

    exp = SlurmExporter(_backend(backend, slurm_conf, rest_url, rest_user, rest_token),
                        fill_partition=fill_partition)
    if once:
        ok = exp.poll()
        sys.stdout.write(exp.exposition().decode())
        if not ok:
            raise UserError("Slurm could not be queried (ttsfleet_slurm_up 0)")
        return
    from prometheus_client import start_http_server

    start_http_server(port, addr=address, registry=exp.registry)
    while True:
        exp.poll()
        time.sleep(interval_s)


@app.command("local-cluster")
def local_cluster(
    directory: Path = typer.Argument(..., help="where configs, state, logs and sockets live"),
    gpus: int = typer.Option(4, "--gpus", min=0, help="fake GPUs per node"),
    gpu_class: str | None = _GPU_CLASS, catalog: Path | None = _CATALOG,
    nodes: int = typer.Option(1, "--nodes", min=1),
    grace_period_s: int = typer.Option(5, "--grace-time", min=1),
    cred_expire_s: int = typer.Option(5, "--cred-expire", min=1),
    restd: bool = typer.Option(False, "--restd", help="also run slurmrestd on a unix socket"),
) -> None:
    """Run a real one-host Slurm cluster (root, munge + slurm installed) until Ctrl-C."""
    import signal
    import time

    from ttsfleet.devtools.localcluster import LocalCluster, LocalClusterError, LocalClusterSpec

    cls = _gpu_class(gpu_class, catalog) if gpu_class else _catalog(catalog).names()[0]
    spec = LocalClusterSpec(nodes=nodes, gpus_per_node=gpus, gpu_class=cls, grace_period_s=grace_period_s,
                            cred_expire_s=cred_expire_s, restd=restd)
    cluster = LocalCluster(directory, spec)
    try:
        cluster.start()
    except LocalClusterError as exc:
        cluster.stop()
        raise UserError(str(exc)) from None
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    typer.echo(f"export SLURM_CONF={cluster.conf_path}")
    if restd:
        typer.echo(f"export TTSFLEET_SLURMRESTD_URL=unix:{cluster.restd_socket}")
    typer.echo("Ctrl-C stops the cluster.")
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        cluster.stop()
