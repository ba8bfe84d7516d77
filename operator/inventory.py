"""Fleet GPU allocation metrics: ``ttsfleet_gpus``, ``ttsfleet_gpus_active``, ``ttsfleet_gpus_total``.

Exported from a loop the operator starts at startup, so the dashboards see GPUs by class and
workload (inference | training | fill | idle) whether or not any FillJob exists. An inference GPU
counts as active when its pod had a request in flight at the last autoscaling scrape.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from ttsfleet.operator import fillview as fv
from ttsfleet.operator.runtime import Runtime

from ttsfleet.catalog import GpuCatalog
from ttsfleet.contracts.fill import CHECKPOINT_INTERVAL_S
from ttsfleet.policy import ClassObservation

log = logging.getLogger(__name__)


def allocation(obs: ClassObservation) -> dict[str, int]:
    """GPUs by workload for one class (fill pods not yet bound count as fill: they are reserved)."""
    fill = sum(j.gpus for j in obs.fill_jobs)
    usable = max(obs.total_gpus - obs.unavailable_gpus, 0)
    idle = max(usable - obs.inference_gpus - obs.training_gpus - fill, 0)
    return {"inference": obs.inference_gpus, "training": obs.training_gpus, "fill": fill, "idle": idle}


def active(nodes: Sequence[Mapping[str, Any]], pods: Sequence[Mapping[str, Any]],
           busy: Mapping[str, bool], catalog: GpuCatalog) -> dict[str, dict[str, int]]:
    """GPUs doing work, by class and workload: running fill and training pods, busy inference pods."""
    node_class = fv.inventory(nodes, catalog).node_class
    out: dict[str, dict[str, int]] = {}
    for pod in pods:
        node = (pod.get("spec") or {}).get("nodeName")
        cls = node_class.get(node or "")
        if not cls or (pod.get("status") or {}).get("phase") != "Running":
            continue
        kind = fv.workload(pod)
        meta = pod["metadata"]
        if kind == "inference" and not busy.get(f"{meta.get('namespace', '')}/{meta['name']}"):
            continue
        per = out.setdefault(cls, {})
        per[kind] = per.get(kind, 0) + fv.pod_gpus(pod)
    return out


async def inventory_pass(rt: Runtime) -> dict[str, dict[str, int]]:
    nodes = await rt.view.gpu_nodes()
    pods = await rt.view.gpu_pods()
    live = {f"{p['metadata'].get('namespace', '')}/{p['metadata']['name']}" for p in pods}
    for key in [k for k in rt.inference_busy if k not in live]:
        del rt.inference_busy[key]
    observations = fv.observe(nodes, pods, rt.now(), rt.wall(), CHECKPOINT_INTERVAL_S, rt.catalog)
    working = active(nodes, pods, rt.inference_busy, rt.catalog)
    result = {}
    for cls, obs in observations.items():
        alloc = allocation(obs)
        rt.metrics["gpus_total"].labels(gpu_class=cls).set(obs.total_gpus)
        for workload, n in alloc.items():
            rt.metrics["gpus"].labels(gpu_class=cls, workload=workload).set(n)
        for workload in ("inference", "training", "fill"):
            rt.metrics["gpus_active"].labels(gpu_class=cls, workload=workload).set(
                working.get(cls, {}).get(workload, 0))
        result[cls] = alloc
    return result


async def inventory_loop(rt: Runtime) -> None:
    while True:
        try:
            await inventory_pass(rt)
        except Exception as exc:  # keep exporting after API hiccups
            log.warning("GPU inventory pass failed: %r", exc)
        await asyncio.sleep(rt.fill_interval_s)
