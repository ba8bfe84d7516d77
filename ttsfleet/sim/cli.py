"""``ttsfleet simulate``: the main command, runnable with no cluster and no arguments.

Option defaults and help come from the config models (:class:`~ttsfleet.config.AutoscaleConfig`,
:class:`~ttsfleet.config.FillPolicyConfig`, :class:`~ttsfleet.sim.scenario.Scenario`,
:class:`~ttsfleet.sim.scenario.FillWorkload`), so a default is set in one place.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer
from pydantic import BaseModel

from ttsfleet.config import AutoscaleConfig, ColocationConfig, FillPolicyConfig
from ttsfleet.errors import UserError, validation_text
from ttsfleet.sim.scenario import DEFAULT_FLEET, FILL_BUSY_FRACTION, FillWorkload, Scenario
from ttsfleet.sim.trace import EMBEDDED_DAYS, EMBEDDED_PEAK_LOAD, EMBEDDED_SEED

RUNS = {"policy": "policy (inference + fill)", "inference-only": "inference-only",
        "static-warm": "static-warm"}


def _opt(model: type[BaseModel], name: str, *flags: str, scale: float = 1.0, unit: str = "") -> Any:
    """A typer option whose default and help are the config model field's."""
    f = model.model_fields[name]
    default = model().model_dump()[name] if f.default_factory else f.default
    if scale != 1.0:
        default = default * scale
    text = (f.description or name.removesuffix("_s").replace("_", " ")) + (f" ({unit})" if unit else "")
    return typer.Option(default, *flags, help=text)


def _scenario_default(name: str) -> Any:
    return Scenario.model_fields[name].default


def _scenario_opt(part: str, name: str, *flags: str, unit: str = "") -> Any:
    """A typer option for a knob of one of the scenario's config models (``autoscale``,
    ``fill_policy``): default from the scenario's value, help from the model field."""
    value = _scenario_default(part)
    f = type(value).model_fields[name]
    text = (f.description or name.replace("_", " ")) + (f" ({unit})" if unit else "")
    return typer.Option(getattr(value, name), *flags, help=text)


def _parse_busy(text: str) -> dict[str, float]:
    """``0.87`` (every class) or ``h200=0.87,rtx5090=0.8``."""
    try:
        if "=" not in text:
            return {"*": float(text)}
        return {k.strip(): float(v) for k, v in (p.split("=", 1) for p in text.split(",") if p.strip())}
    except ValueError:
        raise UserError(f"--fill-busy {text!r} must be a fraction or CLASS=FRACTION,...") from None


def _catalog(catalog_file: Path | None, measured: list[str]):  # noqa: ANN202 - GpuCatalog
    from ttsfleet.catalog import NAMED_CURVES, GpuCatalog

    catalog = GpuCatalog.load(catalog_file)
    for item in measured:
        name, sep, path = item.partition("=")
        if not sep or name not in catalog.classes:
            raise UserError(f"--measured {item!r} must be CLASS=FILE with CLASS one of "
                            f"{', '.join(catalog.classes)}")
        try:
            catalog = (catalog.with_named_curve(name, path) if path in NAMED_CURVES
                       else catalog.with_measured_file(name, path))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise UserError(f"--measured {item}: {type(exc).__name__}: {exc}") from None
    return catalog


def _colocation(enabled: bool, max_rtf: float, max_ttfa_ms: float | None,
                interference: str | None) -> ColocationConfig:
    """The run's co-location config from its options (``--interference k=v,...``)."""
    from pydantic import ValidationError

    fields = {"enabled": enabled, "max_rtf": max_rtf,
              "max_ttfa_s": None if max_ttfa_ms is None else max_ttfa_ms / 1000}
    names = {"inference": "inference_throughput", "latency": "inference_latency",
             "fill": "fill_throughput"}
    for part in (interference or "").split(","):
        if not part.strip():
            continue
        key, sep, value = part.partition("=")
        if not sep or key.strip() not in names:
            raise UserError(f"--interference {interference!r} must be inference=SHARE,latency=FACTOR,"
                            "fill=SHARE")
        try:
            fields[names[key.strip()]] = float(value)
        except ValueError:
            raise UserError(f"--interference {key}={value!r} is not a number") from None
    try:
        return ColocationConfig(**fields)
    except ValidationError as exc:
        raise UserError("; ".join(f"--{'-'.join(map(str, e['loc']))}: {e['msg']}"
                                  for e in exc.errors())) from None


def register(root: typer.Typer) -> None:
    """Add ``simulate`` to the root CLI."""

    @root.command()
    def simulate(
        trace: Path | None = typer.Option(
            None, "--trace", help="a trace file: the simulator's CSV (t,rate|arrivals[,mean_frames|"
                                  "text_chars]), an Azure LLM inference CSV, a BurstGPT CSV or a "
                                  "Mooncake JSONL (see --trace-format). Default: the embedded "
                                  "diurnal trace."),
        trace_format: str = typer.Option("auto", "--trace-format",
                                         help="csv | azure | burstgpt | mooncake | auto (from the "
                                              "file's first line)"),
        trace_scale: float = typer.Option(1.0, "--trace-scale",
                                          help="multiply the trace's request rate"),
        trace_peak_load: float | None = typer.Option(
            None, "--trace-peak-load", help="scale the trace so its peak minute is this share of "
                                            "the fleet's peak decode capacity (as --peak-load does "
                                            "for the embedded trace); overrides --trace-scale"),
        trace_start: float = typer.Option(0.0, "--trace-start",
                                          help="replay from this many seconds into the trace"),
        trace_duration: float | None = typer.Option(None, "--trace-duration",
                                                    help="replay this many seconds of the trace"),
        frames_per_token: float = typer.Option(
            1.0, "--frames-per-token", help="decoded audio frames per generated token of an LLM "
                                            "trace (both are one decode step)"),
        warmup: float = typer.Option(
            0.0, "--warmup", help="first replay the trace's last N seconds uncounted, so a short "
                                  "trace starts with the history its own traffic leaves (s)"),
        days: float = typer.Option(EMBEDDED_DAYS, help="length of the embedded trace, days"),
        peak_load: float = typer.Option(EMBEDDED_PEAK_LOAD, help="peak demand of the embedded trace as "
                                        "a share of the fleet's peak decode capacity"),
        peak_rps: float | None = typer.Option(None, help="peak request rate of the embedded trace "
                                                         "(overrides --peak-load)"),
        fleet: str = typer.Option(",".join(f"{k}={v}" for k, v in DEFAULT_FLEET.items()),
                                  help="GPU classes and counts"),
        runs: str = typer.Option(",".join(RUNS), help="runs to compare: policy, inference-only, "
                                                      "static-warm (comma-separated)"),
        training: bool = typer.Option(True, "--training/--no-training",
                                      help="include the embedded training job stream"),
        seed: int = typer.Option(_scenario_default("seed"), help="seed for arrivals"),
        trace_seed: int = typer.Option(EMBEDDED_SEED, help="seed of the embedded trace"),
        policy_interval: float = _opt(Scenario, "policy_interval_s", "--policy-interval", unit="s"),
        gpus_per_node: int = _opt(Scenario, "gpus_per_node", "--gpus-per-node"),
        target_in_flight: float = _scenario_opt("autoscale", "target_in_flight_per_replica",
                                                "--target-in-flight"),
        ttfa_slo_ms: float = _opt(AutoscaleConfig, "ttfa_p99_slo_s", "--ttfa-slo-ms", scale=1000,
                                  unit="ms"),
        scale_down_window: float = _opt(AutoscaleConfig, "scale_down_stabilization_s",
                                        "--scale-down-window", unit="s"),
        burst_headroom: float = _scenario_opt("autoscale", "burst_headroom", "--burst-headroom"),
        forecast: bool = typer.Option(
            _scenario_default("autoscale").forecast, "--forecast/--no-forecast",
            help=AutoscaleConfig.model_fields["forecast"].description),
        forecast_horizon: float | None = _scenario_opt(
            "autoscale", "forecast_horizon_s", "--forecast-horizon",
            unit="s; unset: the class's model load time"),
        forecast_min_growth: float = _scenario_opt("autoscale", "forecast_min_growth",
                                                   "--forecast-min-growth"),
        burst_hold: float = _scenario_opt("autoscale", "burst_hold_s", "--burst-hold", unit="s"),
        observe_nodes: bool = typer.Option(
            _scenario_default("observe_nodes"), "--node-aware/--node-blind",
            help=Scenario.model_fields["observe_nodes"].description),
        min_free_gpus: int = _opt(FillPolicyConfig, "min_free_gpus", "--min-free-gpus"),
        eviction_deadline: float = _opt(FillPolicyConfig, "eviction_deadline_s", "--eviction-deadline",
                                        unit="s"),
        grace: float = _opt(FillPolicyConfig, "grace_period_s", "--grace", unit="s"),
        checkpoint_interval: float = _opt(FillPolicyConfig, "checkpoint_interval_s",
                                          "--checkpoint-interval", unit="s"),
        fill_busy: str = typer.Option(
            str(FILL_BUSY_FRACTION), "--fill-busy",
            help="GPU busy fraction of a running fill job: one value or CLASS=FRACTION,..."),
        fill_start: float = _opt(FillWorkload, "start_s", "--fill-start", unit="s"),
        fill_stop: float = _opt(FillWorkload, "stop_s", "--fill-stop", unit="s"),
        first_checkpoint: float | None = _opt(FillWorkload, "first_checkpoint_s", "--first-checkpoint",
                                              unit="s"),
        admission_lookback: float = _scenario_opt("fill_policy", "admission_lookback_s",
                                                  "--admission-lookback", unit="s"),
        admission_horizon: float = _scenario_opt("fill_policy", "admission_horizon_s",
                                                 "--admission-horizon", unit="s"),
        colocate: bool = typer.Option(
            _scenario_default("colocation").enabled, "--colocate/--no-colocate",
            help="bind inference beside fill on one GPU instead of evicting it (the fill job a "
                 "low-priority co-tenant), where the policy's co-location limit allows"),
        colocate_max_rtf: float = _scenario_opt("colocation", "max_rtf", "--colocate-max-rtf"),
        colocate_max_ttfa_ms: float | None = typer.Option(
            None, "--colocate-max-ttfa-ms",
            help="a co-located replica's TTFA limit, ms (default: the curve's TTFA at the pool's "
                 "in-flight target)"),
        interference: str | None = typer.Option(
            None, "--interference",
            help="co-location cost: inference=SHARE,latency=FACTOR,fill=SHARE (default: the one "
                 "measurement, one H200 with two plain processes: inference keeps "
                 f"{ColocationConfig().inference_throughput:.3f} of its frames/s, its TTFA and RTF "
                 f"x{ColocationConfig().inference_latency:.2f}, fill keeps "
                 f"{ColocationConfig().fill_throughput:.3f})"),
        catalog_file: Path | None = typer.Option(None, "--catalog",
                                                 help="GPU catalog overrides (YAML/JSON)"),
        measured: list[str] = typer.Option(
            [], "--measured", help="CLASS=bench.json: that class's capacity curve from a measured benchmark "
            "(ttsfleet bench engine/serve), e.g. h200=benchmarks/inference_h200/baseline.json, or "
            "CLASS=writeup for the source write-up's curve; repeatable"),
        as_json: bool = typer.Option(False, "--json", help="print the report as JSON"),
        plot_path: Path | None = typer.Option(Path("ttsfleet-simulate.png"), "--plot",
                                              help="write a PNG plot here"),
        no_plot: bool = typer.Option(False, "--no-plot"),
        quiet: bool = typer.Option(False, "--quiet", help="no progress bar"),
    ) -> None:
        """Replay traffic through the fleet policy and report GPU-busy, allocation and latency.

        With no options: a 32 H200 + 32 RTX 5090 fleet under a deterministic 3-day diurnal trace,
        run with the policy (inference + fill), as the autoscaled inference-only baseline and as
        a static always-warm fleet sized for the peak.
        """
        from pydantic import ValidationError

        from ttsfleet.sim.scenario import default_training, parse_fleet
        from ttsfleet.sim.trace import diurnal, peak_rps_for
        from ttsfleet.sim.tracefiles import load_trace

        wanted = [r.strip() for r in runs.split(",") if r.strip()]
        if not wanted or any(r not in RUNS for r in wanted):
            raise UserError(f"--runs {runs!r}: choose from {', '.join(RUNS)}")
        for name, value in (("days", days), ("peak-rps", peak_rps), ("peak-load", peak_load)):
            if value is not None and value <= 0:
                raise UserError(f"--{name} must be > 0, got {value}")
        catalog = _catalog(catalog_file, measured)
        fleet_map = parse_fleet(fleet, catalog)
        busy = _parse_busy(fill_busy)
        busy = {c: busy.get(c, busy.get("*", FILL_BUSY_FRACTION)) for c in fleet_map}
        if peak_rps is None:
            peak_rps = peak_rps_for(peak_load, catalog, fleet_map)
        if trace:
            tr = load_trace(trace, trace_format, frames_per_token=frames_per_token, scale=trace_scale,
                            start_s=trace_start, duration_s=trace_duration)
            if trace_peak_load is not None:
                tr = tr.with_peak_load(trace_peak_load, catalog, fleet_map)
        else:
            tr = diurnal(days, peak_rps=peak_rps, seed=trace_seed)
        colocation = _colocation(colocate, colocate_max_rtf, colocate_max_ttfa_ms, interference)
        try:
            scenario = Scenario(
                catalog=catalog, fleet=fleet_map, gpus_per_node=gpus_per_node,
                autoscale=AutoscaleConfig(**{
                    **_scenario_default("autoscale").model_dump(),
                    "target_in_flight_per_replica": target_in_flight,
                    "ttfa_p99_slo_s": ttfa_slo_ms / 1000,
                    "scale_down_stabilization_s": scale_down_window,
                    "burst_headroom": burst_headroom, "forecast": forecast,
                    "forecast_horizon_s": forecast_horizon,
                    "forecast_min_growth": forecast_min_growth, "burst_hold_s": burst_hold}),
                observe_nodes=observe_nodes,
                fill_policy=FillPolicyConfig(**{
                    **Scenario.model_fields["fill_policy"].default.model_dump(),
                    "min_free_gpus": min_free_gpus, "eviction_deadline_s": eviction_deadline,
                    "grace_period_s": grace, "checkpoint_interval_s": checkpoint_interval,
                    "admission_lookback_s": admission_lookback,
                    "admission_horizon_s": admission_horizon}),
                fill=FillWorkload(start_s=fill_start, stop_s=fill_stop, busy_fraction=busy,
                                  first_checkpoint_s=first_checkpoint),
                colocation=colocation,
                training=default_training(fleet_map, tr.seconds / 86400, trace_seed, catalog,
                                          gpus_per_node) if training else [],
                policy_interval_s=policy_interval, seed=seed)
        except ValidationError as exc:
            raise UserError(validation_text(exc)) from None
        if warmup < 0:
            raise UserError(f"--warmup must be >= 0, got {warmup}")
        _run_and_report(scenario, tr, wanted, as_json=as_json, quiet=quiet,
                        plot_path=None if no_plot else plot_path, warmup_s=int(warmup))


def _run_and_report(scenario: Scenario, tr, wanted: list[str], *, as_json: bool, quiet: bool,  # noqa: ANN001
                    plot_path: Path | None, warmup_s: int = 0) -> None:
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    from ttsfleet.sim.engine import simulate as run_sim
    from ttsfleet.sim.report import plot, print_report
    from ttsfleet.sim.summary import check_targets, summarize

    order = [m for m in ("static-warm", "inference-only", "policy") if m in wanted]
    console = Console(stderr=True, quiet=quiet or as_json)
    results = []
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(),
                  TextColumn("{task.percentage:>3.0f}%"), TimeRemainingColumn(),
                  console=console, transient=True) as progress:
        for mode in order:
            task = progress.add_task(f"simulating {RUNS[mode]}", total=tr.seconds)
            r = run_sim(scenario, tr, mode=mode, warmup_s=warmup_s,
                        progress=lambda t, task=task: progress.update(task, completed=t))
            results.append((RUNS[mode], r))
    summaries = [(name, summarize(r)) for name, r in results]
    by_mode = {s["mode"]: s for _, s in summaries}
    targets = (check_targets(by_mode["policy"], by_mode.get("inference-only"))
               if "policy" in by_mode else None)
    out_plot = plot(results, plot_path) if plot_path is not None else None
    if as_json:
        doc = {"trace": tr.name, "seconds": tr.seconds, "runs": dict(summaries),
               "targets": targets, "plot": str(out_plot) if out_plot else None}
        typer.echo(json.dumps(doc, indent=2))
        return
    print_report(summaries, targets, Console())
    if out_plot:
        Console().print(f"plot: {out_plot}")
