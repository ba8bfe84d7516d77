"""A loop run in numbers and one picture: what the client saw, what the pools did, what fill did.

:func:`summarize` turns a :class:`~ttsfleet.devtools.loop.LoopRun` (or its JSON) into the figures
``ttsfleet demo`` prints and ``tests/loop`` asserts on; :func:`print_summary` and :func:`plot`
show them. Every figure is read from the run's record, none is estimated:

* client side — requests sent, completed, failed (by reason), time to first audio p50 / p99 of
  the completed ones, against the TTSDeployment's ``ttfaP99SloS``;
* pools — replicas per pool (desired by the operator, Ready by the servers' probes), the
  operator's scaling decisions (status.lastDecisions), the inference pods removed on scale-down
  with their exit codes and the requests they were serving when their drain began;
* fill — fill pods admitted, evicted by the operator (``FillEvicted``) and preempted by the
  scheduler (``Preempted``), their exit codes (99: checkpointed and requeued), items committed
  of the manifest's total (the checkpoints), and items lost: outputs a restart had to throw
  away because they were staged but not committed (``orphans_removed`` in the fill job's
  ``started`` events; an orderly stop on SIGTERM commits everything and loses none).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np


def _pct(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


def _requests(run: dict[str, Any]) -> dict[str, Any]:
    reqs = run["requests"]
    ok = [r for r in reqs if r["status"] == 200 and not r["error"] and r["audio_bytes"] > 0]
    ttfa = [r["ttfa_s"] for r in ok if r["ttfa_s"] is not None]
    slo = float(run["config"]["ttsdeployment"]["spec"].get("autoscale", {}).get("ttfaP99SloS", 0.5))
    p99 = _pct(ttfa, 99)
    return {"sent": len(reqs), "completed": len(ok), "failed": len(reqs) - len(ok),
            "errors": dict(Counter((r["error"] or f"HTTP {r['status']}")[:80] for r in reqs if r not in ok)),
            "ttfa_p50_s": _pct(ttfa, 50), "ttfa_p99_s": p99, "ttfa_max_s": max(ttfa) if ttfa else None,
            "slo_s": slo, "within_slo": p99 is not None and p99 <= slo,
            "by_pod": dict(Counter(r["pod"] for r in reqs))}


def drains(run: dict[str, Any]) -> list[dict[str, Any]]:
    """Inference pods removed while the run lasted, with the requests in flight on them then."""
    out = []
    t0 = run["trace_start_s"]
    for p in run["recorder"]["pods"]:
        if p["workload"] != "inference" or p["deleting_s"] is None:
            continue
        d = p["deleting_s"]
        busy = [r for r in run["requests"]
                if r["pod"] == p["name"] and r["sent_s"] + t0 <= d < r["sent_s"] + t0 + r["duration_s"]]
        out.append({"pod": p["name"], "pool": p["pool"], "deleting_s": round(d - t0, 1),
                    "exit_code": p["exit_code"], "deletion_cost": p["deletion_cost"],
                    "others_cost": p["costs_at_deletion"], "in_flight": len(busy),
                    "in_flight_failed": sum(1 for r in busy if r["status"] != 200 or r["error"])})
    return out


def _pools(run: dict[str, Any]) -> dict[str, Any]:
    samples = run["recorder"]["samples"]
    pools = sorted({k for s in samples for k in s["desired"]})
    status = run["ttsdeployment"].get("status") or {}
    decisions = status.get("lastDecisions") or []
    return {"pools": pools,
            "peak_desired": {p: max((s["desired"].get(p, 0) for s in samples), default=0) for p in pools},
            "final_desired": {p: samples[-1]["desired"].get(p, 0) if samples else 0 for p in pools},
            "scale_ups": [d for d in decisions if d["direction"] == "up"],
            "scale_downs": [d for d in decisions if d["direction"] == "down"],
            "drains": drains(run)}


def lost_items(run: dict[str, Any]) -> int:
    return sum(int(e.get("orphans_removed") or 0) for events in run["fill_logs"].values()
               for e in events if e.get("event") == "started")


def _fill(run: dict[str, Any]) -> dict[str, Any]:
    fill_pods = [p for p in run["recorder"]["pods"] if p["workload"] == "fill"]
    events = run["recorder"]["events"]
    status = run["filljob"].get("status") or {}
    report = run["fill_report"]
    evicted = [e for e in events if e["reason"] == "FillEvicted"]
    return {"pods_admitted": len(fill_pods),
            "pods_stopped": sum(1 for p in fill_pods if p["deleting_s"] is not None and p["exit_code"] != 0),
            "pods_completed": sum(1 for p in fill_pods if p["exit_code"] == 0),
            "exit_codes": dict(Counter(str(p["exit_code"]) for p in fill_pods)),
            "evictions_by_operator": sum(int(_count(e["message"])) for e in evicted),
            "eviction_events": len(evicted),
            "preempted_by_scheduler": sum(1 for e in events if e["reason"] == "Preempted"),
            "items_done": int(report.get("items_done", 0)), "items_total": int(report.get("items_total", 0)),
            "items_lost": lost_items(run), "complete": bool(report.get("complete")),
            "preemptions_survived": int(report.get("preemptions_survived", 0)),
            "shards_done": status.get("shardsDone"), "operator_lost_work_s": status.get("lostWorkSeconds")}


def _count(message: str) -> int:
    """N of the operator's 'evict N fill job(s)' message."""
    words = message.split(": ", 1)[-1].split()
    return int(words[1]) if len(words) > 1 and words[0] == "evict" and words[1].isdigit() else 1


def summarize(run: dict[str, Any]) -> dict[str, Any]:
    return {"requests": _requests(run), "pools": _pools(run), "fill": _fill(run), "phases_s": run["phases_s"]}


def _fmt(x: float | None, unit: str = " s", digits: int = 2) -> str:
    return "-" if x is None else f"{x:.{digits}f}{unit}"


def print_summary(summary: dict[str, Any], echo: Any = print) -> None:
    r, p, f = summary["requests"], summary["pools"], summary["fill"]
    echo(f"requests      {r['sent']} sent open-loop, {r['completed']} completed, {r['failed']} failed"
         + (f" {r['errors']}" if r["errors"] else ""))
    echo(f"first audio   p50 {_fmt(r['ttfa_p50_s'])}, p99 {_fmt(r['ttfa_p99_s'])} at the client "
         f"(SLO p99 {r['slo_s']:g} s: {'met' if r['within_slo'] else 'MISSED'})")
    for pool in p["pools"]:
        echo(f"pool {pool:8s} replicas peak {p['peak_desired'][pool]}, end {p['final_desired'][pool]}")
    for d in p["scale_ups"] + p["scale_downs"]:
        echo(f"  {d['time'][11:19]} {d['pool']}: {d['fromReplicas']} -> {d['toReplicas']} ({d['reason']}: "
             f"{d['message'][:90]})")
    for d in p["drains"]:
        echo(f"  drained {d['pod']} at t={d['deleting_s']:g} s: exit {d['exit_code']}, {d['in_flight']} "
             f"request(s) in flight, {d['in_flight_failed']} failed")
    echo(f"fill pods     {f['pods_admitted']} admitted, {f['pods_stopped']} stopped for inference "
         f"({f['evictions_by_operator']} evicted by the operator, {f['preempted_by_scheduler']} preempted "
         f"by the scheduler), {f['pods_completed']} finished their shard; exit codes {f['exit_codes']}")
    echo(f"fill items    {f['items_done']}/{f['items_total']} done, {f['items_lost']} lost "
         f"({f['preemptions_survived']} resumed from checkpoints)")
    echo("phases        " + ", ".join(f"{k} {v:g} s" for k, v in summary["phases_s"].items()))


def plot(run: dict[str, Any], path: Path, title: str = "ttsfleet demo") -> Path:
    """Three panels on the trace's clock: client traffic and first audio, replicas per pool, fill."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t0 = run["trace_start_s"]
    samples = run["recorder"]["samples"]
    ts = [s["t"] - t0 for s in samples]
    fig, (ax1, ax2, ax3) = plt.subplots(3, 1, figsize=(10, 8.5), sharex=True,
                                        gridspec_kw={"height_ratios": [1.2, 1, 1]})
    reqs = run["requests"]
    ok = [r for r in reqs if r["status"] == 200 and not r["error"] and r["ttfa_s"] is not None]
    bad = [r for r in reqs if r not in ok]
    ax1.scatter([r["sent_s"] for r in ok], [r["ttfa_s"] for r in ok], s=10, color="tab:blue",
                label="time to first audio (client)")
    if bad:
        ax1.scatter([r["sent_s"] for r in bad], [0] * len(bad), marker="x", color="tab:red", label="failed")
    slo = float(run["config"]["ttsdeployment"]["spec"].get("autoscale", {}).get("ttfaP99SloS", 0.5))
    ax1.axhline(slo, color="tab:red", linestyle="--", linewidth=1, label=f"SLO p99 {slo:g} s")
    ax1.set_ylabel("first audio (s)")
    rate = ax1.twinx()
    end = max([r["sent_s"] for r in reqs] + [1.0])
    bins = np.arange(0, end + 5, 5)
    counts, _ = np.histogram([r["sent_s"] for r in reqs], bins=bins)
    rate.step(bins[:-1], counts / 5.0, where="post", color="tab:gray", alpha=0.7, label="requests/s sent")
    rate.set_ylabel("requests/s")
    _legend(ax1, rate)

    pools = sorted({k for s in samples for k in s["desired"]})
    colors = dict(zip(pools, ("tab:green", "tab:purple", "tab:orange", "tab:brown"), strict=False))
    for i, pool in enumerate(pools):
        lift = 0.04 * (i - (len(pools) - 1) / 2)  # pools at the same count stay apart
        ax2.step(ts, [s["desired"].get(pool, 0) + lift for s in samples], where="post", linestyle="--",
                 color=colors[pool], alpha=0.8, label=f"{pool} desired")
        ax2.step(ts, [s["ready"].get(pool, 0) + lift for s in samples], where="post", color=colors[pool],
                 linewidth=2, label=f"{pool} ready")
    load = ax2.twinx()
    load.plot(ts, [sum(s.get("server_load", {}).values()) for s in samples], color="tab:gray", alpha=0.5,
              linewidth=1, label="in flight + queued (servers' /metrics)")
    load.set_ylabel("requests")
    ax2.set_ylabel("inference replicas")
    _legend(ax2, load)

    classes = sorted({k for s in samples for k in s["fill_running"]} | set(pools))
    ax3.stackplot(ts, [[s["fill_running"].get(c, 0) for s in samples] for c in classes],
                  labels=[f"fill pods on {c}" for c in classes],
                  colors=[colors.get(c, "tab:cyan") for c in classes], alpha=0.35, step="post")
    for e in run["recorder"]["events"]:
        marker = {"FillAdmitted": ("^", "tab:green"), "FillEvicted": ("v", "tab:red"),
                  "Preempted": ("x", "black")}.get(e["reason"])
        if marker:
            ax3.scatter([e["t"] - t0], [0.1], marker=marker[0], color=marker[1], s=45, zorder=3)
    ax3.set_ylabel("fill pods running")
    items = ax3.twinx()
    items.plot(ts, [s.get("fill_items_done", 0) for s in samples], color="black", linewidth=1.5,
               label="fill items done")
    items.set_ylabel("items")
    ax3.scatter([], [], marker="^", color="tab:green", label="admitted")
    ax3.scatter([], [], marker="v", color="tab:red", label="evicted by operator")
    _legend(ax3, items)
    ax3.set_xlabel("seconds since the trace started")
    s = summarize(run)
    r, f = s["requests"], s["fill"]
    fig.suptitle(f"{title}: {r['completed']}/{r['sent']} requests, first audio p50 {_fmt(r['ttfa_p50_s'])} "
                 f"p99 {_fmt(r['ttfa_p99_s'])} (SLO {slo:g} s); fill {f['items_done']}/{f['items_total']} "
                 f"items, {f['items_lost']} lost", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _legend(ax: Any, twin: Any) -> None:
    h1, l1 = ax.get_legend_handles_labels()
    h2, l2 = twin.get_legend_handles_labels()
    ax.legend(h1 + h2, l1 + l2, loc="upper right", fontsize=7, framealpha=0.8)
