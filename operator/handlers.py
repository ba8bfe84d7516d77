"""The kopf wiring: one small handler per event, all logic in the controller modules.

:func:`build_registry` returns a fresh :class:`kopf.OperatorRegistry` whose handlers close over one
:class:`~ttsfleet.operator.runtime.Runtime`, so timer intervals are configurable and a test can run
(and restart) an operator without global state. Status goes out through kopf's ``patch`` argument.
"""

from __future__ import annotations

import asyncio
from typing import Any

import kopf
from ttsfleet.operator import fill, inference, inventory
from ttsfleet.operator import status as st
from ttsfleet.operator.models import GROUP, VERSION
from ttsfleet.operator.runtime import Runtime

TTSD = (GROUP, VERSION, "ttsdeployments")
FILLJOB = (GROUP, VERSION, "filljobs")


def configure(settings: kopf.OperatorSettings) -> kopf.OperatorSettings:
    """Settings both ``operator run`` and the tests use."""
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="ttsfleet.io")
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix="ttsfleet.io")
    settings.persistence.finalizer = "ttsfleet.io/operator"
    settings.peering.standalone = True
    settings.scanning.disabled = True
    settings.posting.level = 30  # kopf's own events: warnings and errors only; ours are explicit
    settings.watching.server_timeout = 300
    # A deletion that lands while a timer runs waits for it to exit, re-checked every this many
    # seconds (kopf's default 60 s held every such delete, and uninstalls, for a minute).
    settings.background.cancellation_polling = 1.0
    return settings


def build_registry(rt: Runtime) -> kopf.OperatorRegistry:
    registry = kopf.OperatorRegistry()

    @kopf.on.login(id="login", registry=registry)
    def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        return kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(**kwargs)

    tasks: list[asyncio.Task[None]] = []

    @kopf.on.startup(id="inventory", registry=registry)
    async def start_inventory(**_: Any) -> None:
        rt.view.start()  # the pod and node watches (the controllers' observation source)
        tasks.append(asyncio.create_task(inventory.inventory_loop(rt)))

    @kopf.on.cleanup(id="inventory", registry=registry)
    async def stop_inventory(**_: Any) -> None:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await rt.view.aclose()

    # Explicit ids: kopf keeps handler progress in annotations named after them, so they must not
    # change when the code is refactored (a restart must find its own progress).
    @kopf.on.resume(*TTSD, id="reconcile", registry=registry, backoff=15)
    @kopf.on.create(*TTSD, id="reconcile", registry=registry, backoff=15)
    @kopf.on.update(*TTSD, id="reconcile", field="spec", registry=registry, backoff=15)
    async def ttsd_reconcile(body: kopf.Body, status: kopf.Status, patch: kopf.Patch, **_: Any) -> None:
        try:
            patch.status.update(st.changes(status, await inference.reconcile(rt, body, status)))
        except Exception as exc:
            # Visible in status while kopf retries (API errors, conflicts, webhooks).
            rt.metrics["operator_reconcile_errors"].labels(kind="TTSDeployment").inc()
            patch.status["conditions"] = inference.degraded(body, status, "ReconcileError", repr(exc))
            raise kopf.TemporaryError(f"reconcile failed: {exc!r}", delay=rt.retry_delay_s) from exc

    @kopf.timer(*TTSD, id="autoscale", interval=rt.autoscale_interval_s,
                initial_delay=rt.autoscale_interval_s, registry=registry)
    async def ttsd_autoscale(body: kopf.Body, status: kopf.Status, patch: kopf.Patch,
                             memo: kopf.Memo, **_: Any) -> None:
        mem = memo.setdefault("autoscale", inference.Memory())
        # Continuous reconcile-by-diff first: children deleted or edited by hand come back.
        try:
            fixed = await inference.reconcile(rt, body, status)
        except Exception as exc:
            rt.metrics["operator_reconcile_errors"].labels(kind="TTSDeployment").inc()
            fixed = {"conditions": inference.degraded(body, status, "ReconcileError", repr(exc))}
        out = await inference.autoscale(rt, body, {**status, **fixed}, mem)
        patch.status.update(st.changes(status, {**fixed, **(out or {})}))

    @kopf.on.delete(*TTSD, id="cleanup", registry=registry, backoff=rt.retry_delay_s)
    async def ttsd_delete(body: kopf.Body, **_: Any) -> None:
        rt.inference_need.pop(f"{body['metadata'].get('namespace')}/{body['metadata']['name']}", None)
        await inference.delete_children(rt, body, body.get("spec"))

    @kopf.timer(*FILLJOB, id="fill", interval=rt.fill_interval_s, registry=registry, backoff=rt.retry_delay_s)
    async def filljob_pass(body: kopf.Body, status: kopf.Status, patch: kopf.Patch, **_: Any) -> None:
        try:
            patch.status.update(st.changes(status, await fill.fill_pass(rt, body, status)))
        except Exception:
            rt.metrics["operator_reconcile_errors"].labels(kind="FillJob").inc()
            raise

    return registry
