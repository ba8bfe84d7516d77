"""``ttsfleet simulate``: the main command, runnable with no cluster and no arguments."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from ttsfleet.errors import UserError
from ttsfleet.sim.scenario import DEFAULT_FLEET


def register(root: typer.Typer) -> None:
    """Add ``simulate`` to the root CLI."""

    @root.command()
    def simulate(
        trace: Path | None = typer.Option(
            None, "--trace", help="CSV of arrivals: t,rate|arrivals[,mean_frames|text_chars]. "
                                  "Default: the embedded diurnal trace."),
        days: float = typer.Option(3.0, help="length of the embedded trace, days"),
        peak_rps: float = typer.Option(1200.0, help="peak request rate of the embedded trace"),
        fleet: str = typer.Option(",".join(f"{k}={v}" for k, v in DEFAULT_FLEET.items()),
                                  help="GPU classes and counts"),
        no_fill: bool = typer.Option(False, "--no-fill",
                                     help="only the inference-only baseline (no fill jobs)"),
        baseline: bool = typer.Option(True, "--baseline/--no-baseline",
                                      help="also run the inference-only baseline for comparison"),
        training: bool = typer.Option(True, "--training/--no-training",
                                      help="include the embedded training job stream"),
        seed: int = typer.Option(0, help="seed for arrivals (the trace has its own seed)"),
        trace_seed: int = typer.Option(7, help="seed of the embedded trace"),
        policy_interval: float = typer.Option(15.0, help="operator cadence, seconds"),
        target_in_flight: float = typer.Option(40.0, help="in-flight requests per H200 replica"),
        ttfa_slo_ms: float = typer.Option(500.0, help="time-to-first-audio p99 SLO, ms"),
        scale_down_window: float = typer.Option(300.0, help="scale-down stabilization, seconds"),
        min_free_gpus: int = typer.Option(0, help="GPUs per class always kept empty"),
        eviction_deadline: float = typer.Option(120.0, help="forecast horizon for fill headroom, s"),
        grace: float = typer.Option(30.0, help="fill eviction grace period, s"),
        checkpoint_interval: float = typer.Option(60.0, help="fill checkpoint interval, s"),
        catalog_file: Path | None = typer.Option(None, "--catalog",
                                                 help="GPU catalog overrides (YAML/JSON)"),
        measured: list[str] = typer.Option(
            [], "--measured", help="CLASS=bench.json: that class's capacity curve from a measured benchmark "
            "(ttsfleet bench engine/serve), e.g. h200=benchmarks/inference_h200/baseline.json; repeatable"),
        as_json: bool = typer.Option(False, "--json", help="print the report as JSON"),
        plot_path: Path | None = typer.Option(Path("ttsfleet-simulate.png"), "--plot",
                                              help="write a PNG plot here"),
        no_plot: bool = typer.Option(False, "--no-plot"),
        quiet: bool = typer.Option(False, "--quiet", help="no progress bar"),
    ) -> None:
        """Replay traffic through the fleet policy and report GPU utilization and latency.

        With no options: a 32 H200 + 32 RTX 5090 fleet under a deterministic 3-day diurnal trace,
        run with the policy (inference + fill) and as the inference-only baseline.
        """
        from pydantic import ValidationError
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

        from ttsfleet.catalog import GpuCatalog
        from ttsfleet.config import AutoscaleConfig, FillPolicyConfig
        from ttsfleet.sim.engine import check_targets, summarize
        from ttsfleet.sim.engine import simulate as run_sim
        from ttsfleet.sim.report import plot, print_report
        from ttsfleet.sim.scenario import Scenario, default_pools_for, default_training, parse_fleet
        from ttsfleet.sim.trace import diurnal, load_csv

        for name, value in (("days", days), ("peak-rps", peak_rps), ("policy-interval", policy_interval),
                            ("target-in-flight", target_in_flight), ("ttfa-slo-ms", ttfa_slo_ms),
                            ("grace", grace), ("checkpoint-interval", checkpoint_interval),
                            ("eviction-deadline", eviction_deadline)):
            if value <= 0:
                raise UserError(f"--{name} must be > 0, got {value}")
        if min_free_gpus < 0 or scale_down_window < 0:
            raise UserError("--min-free-gpus and --scale-down-window must be >= 0")
        try:
            catalog = GpuCatalog.from_file(catalog_file) if catalog_file else GpuCatalog.default()
        except (OSError, ValueError) as exc:
            raise UserError(f"catalog {catalog_file}: {exc}") from None
        for item in measured:
            name, sep, path = item.partition("=")
            if not sep or name not in catalog.classes:
                raise UserError(f"--measured {item!r} must be CLASS=FILE with CLASS one of "
                                f"{', '.join(catalog.classes)}")
            try:
                catalog = catalog.with_measured_file(name, path)
            except (OSError, ValueError, KeyError, TypeError) as exc:
                raise UserError(f"--measured {item}: {type(exc).__name__}: {exc}") from None
        fleet_map = parse_fleet(fleet, catalog)
        tr = load_csv(trace) if trace else diurnal(days, peak_rps=peak_rps, seed=trace_seed)
        sim_days = tr.seconds / 86400
        try:
            scenario = Scenario(
                fleet=fleet_map,
                pools=default_pools_for(fleet_map),
                autoscale=AutoscaleConfig(target_in_flight_per_replica=target_in_flight,
                                          ttfa_p99_slo_s=ttfa_slo_ms / 1000,
                                          scale_down_stabilization_s=scale_down_window),
                fill_policy=FillPolicyConfig(min_free_gpus=min_free_gpus,
                                             eviction_deadline_s=eviction_deadline,
                                             grace_period_s=grace,
                                             checkpoint_interval_s=checkpoint_interval),
                training=default_training(fleet_map, sim_days, trace_seed) if training else [],
                policy_interval_s=policy_interval,
                seed=seed,
            )
        except ValidationError as exc:
            raise UserError("; ".join(e["msg"] for e in exc.errors())) from None

        modes: list[tuple[str, bool]] = []
        if no_fill:
            modes.append(("inference-only", False))
        else:
            if baseline:
                modes.append(("inference-only", False))
            modes.append(("policy (inference + fill)", True))
        console = Console(stderr=True, quiet=quiet or as_json)
        results = []
        with Progress(TextColumn("[bold]{task.description}"), BarColumn(),
                      TextColumn("{task.percentage:>3.0f}%"), TimeRemainingColumn(),
                      console=console, transient=True) as progress:
            for name, with_fill in modes:
                task = progress.add_task(f"simulating {name}", total=tr.seconds)
                r = run_sim(scenario, tr, fill=with_fill, catalog=catalog,
                            progress=lambda t, task=task: progress.update(task, completed=t))
                results.append((name, r))
        summaries = [(name, summarize(r)) for name, r in results]
        base = next((s for n, s in summaries if n == "inference-only"), None)
        pol = next((s for n, s in summaries if n != "inference-only"), None)
        targets = check_targets(pol, base) if pol else None
        out_plot = None
        if not no_plot and plot_path is not None:
            out_plot = plot(results, plot_path)
        if as_json:
            doc = {"trace": tr.name, "seconds": tr.seconds, "runs": dict(summaries),
                   "targets": targets, "plot": str(out_plot) if out_plot else None}
            typer.echo(json.dumps(doc, indent=2))
            return
        print_report(summaries, targets, Console())
        if out_plot:
            Console().print(f"plot: {out_plot}")
