"""``ttsfleet operator ...`` commands: run the operator, write the CRDs, render a manifest's objects.

kopf, kubernetes and the controllers are imported inside the commands so ``ttsfleet --help`` and
the other components' commands stay fast.
"""

from __future__ import annotations

from pathlib import Path

import typer

from ttsfleet.errors import UserError, validation_text

app = typer.Typer(no_args_is_help=True)
CATALOG_OPTION = typer.Option(None, "--catalog", help="GPU catalog file merged over the built-in classes")


@app.command()
def run(
    metrics_port: int = typer.Option(8080, help="Prometheus /metrics port"),
    health_port: int = typer.Option(8081, help="liveness GET /healthz port"),
    namespace: list[str] = typer.Option([], "--namespace", "-n",
                                        help="watch only these namespaces (repeatable); default all"),
    autoscale_interval: float = typer.Option(15.0, help="seconds between autoscaling steps"),
    fill_interval: float = typer.Option(10.0, help="seconds between fill controller passes"),
    verbose: bool = typer.Option(False, "--verbose", "-v"),
    catalog: Path | None = CATALOG_OPTION,
    leader_elect: bool = typer.Option(
        False, "--leader-elect", help="act only while holding a coordination.k8s.io Lease (replicas > 1)"),
    lease_name: str = typer.Option("ttsfleet-operator", help="the Lease's name"),
    lease_namespace: str = typer.Option("", help="the Lease's namespace (default: $POD_NAMESPACE)"),
    lease_duration: float = typer.Option(15.0, help="seconds a standby waits for an unrenewed Lease"),
    renew_deadline: float = typer.Option(10.0, help="seconds the leader may fail to renew before it stops"),
    retry_period: float = typer.Option(2.0, help="seconds between Lease renewals and attempts"),
) -> None:
    """Run the operator (kopf). TTSFLEET_PROMETHEUS_URL switches signals to PromQL."""
    for port in (metrics_port, health_port):
        if not 0 < port < 65536:
            raise UserError(f"port {port} is out of range 1-65535")
    if metrics_port == health_port:
        raise UserError("--metrics-port and --health-port must differ")
    if autoscale_interval <= 0 or fill_interval <= 0:
        raise UserError("intervals must be positive")
    import asyncio
    import logging
    import os

    from ttsfleet.operator.leader import LeadershipLost, LeaseConfig
    from ttsfleet.operator.main import serve

    lease = None
    if leader_elect:
        namespace_ = lease_namespace or os.environ.get("POD_NAMESPACE", "")
        if not namespace_:
            raise UserError("--leader-elect needs --lease-namespace or $POD_NAMESPACE")
        try:
            lease = LeaseConfig(namespace=namespace_, name=lease_name,
                                identity=LeaseConfig.default_identity(), lease_duration_s=lease_duration,
                                renew_deadline_s=renew_deadline, retry_period_s=retry_period)
        except ValueError as exc:
            raise UserError(str(exc)) from None

    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from ttsfleet.catalog import GpuCatalog

    cat = GpuCatalog.load(catalog)
    try:
        asyncio.run(serve(metrics_port=metrics_port, health_port=health_port, namespaces=namespace,
                          autoscale_interval_s=autoscale_interval, fill_interval_s=fill_interval,
                          catalog=cat, lease=lease))
    except LeadershipLost as exc:
        # Stopped acting at once; exit so the pod restarts as a fresh candidate (client-go does so).
        logging.getLogger("ttsfleet.operator").error("%s: exiting", exc)
        raise typer.Exit(1) from None


@app.command()
def crds(
    out: Path = typer.Option(Path("charts/ttsfleet/crds"), help="directory for the CRD YAML files"),
    check: bool = typer.Option(False, help="only compare; exit 1 when the files are stale"),
    catalog: Path | None = CATALOG_OPTION,
) -> None:
    """Write the TTSDeployment and FillJob CRDs generated from the operator's models (GPU class
    enums from the catalog)."""
    from ttsfleet.operator.crds import crd_documents, render, write_crds

    from ttsfleet.catalog import GpuCatalog

    cat = GpuCatalog.load(catalog)
    if check:
        stale = [name for name, doc in crd_documents(cat).items()
                 if not (out / name).exists() or (out / name).read_text() != render(doc)]
        if stale:
            typer.echo(f"stale: {', '.join(stale)} (run: ttsfleet operator crds --out {out})", err=True)
            raise typer.Exit(1)
        typer.echo("CRDs up to date")
        return
    if out.exists() and not out.is_dir():
        raise UserError(f"{out} exists and is not a directory")
    for path in write_crds(out, cat):
        typer.echo(str(path))


@app.command()
def render(
    manifest: Path = typer.Argument(..., help="a TTSDeployment YAML manifest"),
    catalog: Path | None = CATALOG_OPTION,
) -> None:
    """Print the Deployments, Services and PDBs the operator would create for a TTSDeployment."""
    import yaml
    from pydantic import ValidationError
    from ttsfleet.operator.desired import desired_objects, name_problems
    from ttsfleet.operator.models import TTSDeploymentSpec

    from ttsfleet.catalog import GpuCatalog

    if not manifest.is_file():
        raise UserError(f"{manifest}: no such file")
    try:
        doc = yaml.safe_load(manifest.read_text())
    except yaml.YAMLError as exc:
        raise UserError(f"{manifest}: not YAML ({exc})") from None
    if not isinstance(doc, dict) or doc.get("kind") != "TTSDeployment":
        raise UserError(f"{manifest}: expected a TTSDeployment manifest")
    name = (doc.get("metadata") or {}).get("name")
    if not name:
        raise UserError(f"{manifest}: metadata.name is missing")
    cat = GpuCatalog.load(catalog)
    try:
        spec = TTSDeploymentSpec.model_validate(doc.get("spec") or {}, context={"catalog": cat})
    except ValidationError as exc:
        raise UserError(f"{manifest}: invalid spec: {validation_text(exc)}") from None
    if problems := name_problems(name, spec):
        raise UserError("; ".join(problems))
    ns = (doc.get("metadata") or {}).get("namespace")
    objs = desired_objects(name, spec, cat)
    for obj in objs:
        if ns:
            obj["metadata"]["namespace"] = ns
    typer.echo(yaml.safe_dump_all(objs, sort_keys=False), nl=False)
