"""A small async Kubernetes REST client (httpx) for the operator's own API calls.

kopf talks to the API for the watched resources; everything the handlers create, patch, list or
delete goes through this client. It stays on the event loop (no threads), speaks only GET, POST,
merge-PATCH and DELETE (no PUT, no server-side apply), and takes its credentials from the pod's
service account or a kubeconfig through the official ``kubernetes`` loader.
"""

from __future__ import annotations

import datetime
import json
import os
import ssl
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

SA_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")


class KubeError(RuntimeError):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status


def path(api_version: str, plural: str, namespace: str | None = None, name: str | None = None,
         sub: str | None = None) -> str:
    """REST path: ``/api/v1/...`` for the core group, ``/apis/GROUP/VERSION/...`` otherwise."""
    base = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
    parts = [base]
    if namespace:
        parts.append(f"namespaces/{namespace}")
    parts.append(plural)
    if name:
        parts.append(name)
    if sub:
        parts.append(sub)
    return "/".join(parts)


#: kind → (apiVersion, plural) for the built-in kinds the operator touches.
KINDS = {
    "Deployment": ("apps/v1", "deployments"),
    "Service": ("v1", "services"),
    "ConfigMap": ("v1", "configmaps"),
    "PodDisruptionBudget": ("policy/v1", "poddisruptionbudgets"),
    "Pod": ("v1", "pods"),
    "Node": ("v1", "nodes"),
    "Event": ("v1", "events"),
}


def obj_path(obj: dict[str, Any], *, named: bool = True) -> str:
    api_version, plural = KINDS[obj["kind"]]
    meta = obj["metadata"]
    return path(api_version, plural, meta.get("namespace"), meta["name"] if named else None)


@dataclass
class Kube:
    client: httpx.AsyncClient
    token_file: Path | None = None

    @classmethod
    def from_environment(cls) -> Kube:
        """In a pod: the service account; elsewhere: ``$KUBECONFIG`` / ``~/.kube/config``."""
        if os.environ.get("KUBERNETES_SERVICE_HOST") and (SA_DIR / "token").exists():
            host = os.environ["KUBERNETES_SERVICE_HOST"]
            port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
            client = httpx.AsyncClient(base_url=f"https://{host}:{port}",
                                       verify=ssl.create_default_context(cafile=str(SA_DIR / "ca.crt")),
                                       timeout=30)
            return cls(client, SA_DIR / "token")
        from kubernetes import client as kclient
        from kubernetes import config as kconfig

        cfg = kclient.Configuration()
        kconfig.load_kube_config(config_file=os.environ.get("KUBECONFIG") or None, client_configuration=cfg)
        headers = {}
        token = (cfg.api_key or {}).get("authorization") or (cfg.api_key or {}).get("BearerToken")
        if token:
            headers["Authorization"] = token if token.lower().startswith("bearer ") else f"Bearer {token}"
        verify: Any = cfg.verify_ssl
        if cfg.ssl_ca_cert or cfg.cert_file:
            verify = ssl.create_default_context(cafile=cfg.ssl_ca_cert or None)
            if cfg.cert_file:
                verify.load_cert_chain(cfg.cert_file, cfg.key_file)
        client = httpx.AsyncClient(base_url=cfg.host, headers=headers, verify=verify, timeout=30)
        return cls(client)

    async def aclose(self) -> None:
        await self.client.aclose()

    async def _request(self, method: str, url: str, **kw: Any) -> httpx.Response:
        headers = dict(kw.pop("headers", {}))
        if self.token_file is not None:
            headers["Authorization"] = f"Bearer {self.token_file.read_text().strip()}"
        return await self.client.request(method, url, headers=headers, **kw)

    @staticmethod
    def _check(resp: httpx.Response) -> dict[str, Any]:
        if resp.status_code >= 400:
            try:
                msg = resp.json().get("message", resp.text)
            except ValueError:
                msg = resp.text
            raise KubeError(resp.status_code, str(msg)[:300])
        return resp.json() if resp.content else {}

    async def get(self, url: str) -> dict[str, Any] | None:
        resp = await self._request("GET", url)
        if resp.status_code == 404:
            return None
        return self._check(resp)

    async def list(self, url: str, *, labels: str | None = None,
                   fields: str | None = None) -> list[dict[str, Any]]:
        """Items of a collection, narrowed on the server by label and field selectors."""
        items: list[dict[str, Any]] = []
        async for page in self.list_pages(url, labels=labels, fields=fields):
            items.extend(page.get("items") or [])
        return items

    async def list_pages(self, url: str, *, labels: str | None = None, fields: str | None = None,
                         limit: int = 500) -> AsyncIterator[dict[str, Any]]:
        """A collection in pages of ``limit`` (``continue`` tokens), so a 5,000-pod LIST never
        sits in memory as one 31 MiB body. Each page is the raw list (its ``metadata`` carries
        the ``resourceVersion`` a watch starts from)."""
        params = {k: v for k, v in (("labelSelector", labels), ("fieldSelector", fields)) if v}
        params["limit"] = str(limit)
        while True:
            resp = await self._request("GET", url, params=params)
            if resp.status_code == 404:
                return
            page = self._check(resp)
            yield page
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                return
            params["continue"] = token

    async def watch(self, url: str, resource_version: str, *, labels: str | None = None,
                    fields: str | None = None, timeout_s: int = 300) -> AsyncIterator[dict[str, Any]]:
        """Watch events (``{"type", "object"}``) from ``resource_version`` on, bookmarks included,
        until the server ends the watch (``timeoutSeconds``). A 410 Gone, as an HTTP status or as
        an ERROR event, raises :class:`KubeError` with status 410: the caller lists again."""
        params = {k: v for k, v in (("labelSelector", labels), ("fieldSelector", fields)) if v}
        params.update(watch="true", allowWatchBookmarks="true", resourceVersion=resource_version,
                      timeoutSeconds=str(timeout_s))
        headers = {}
        if self.token_file is not None:
            headers["Authorization"] = f"Bearer {self.token_file.read_text().strip()}"
        timeout = httpx.Timeout(30.0, read=timeout_s + 30.0)
        async with self.client.stream("GET", url, params=params, headers=headers, timeout=timeout) as resp:
            if resp.status_code >= 400:
                await resp.aread()
                self._check(resp)
            async for line in resp.aiter_lines():
                if not line.strip():
                    continue
                event = json.loads(line)
                if event.get("type") == "ERROR":
                    status = event.get("object") or {}
                    raise KubeError(int(status.get("code") or 500), str(status.get("message", ""))[:300])
                yield event

    async def create(self, url: str, body: dict[str, Any]) -> dict[str, Any]:
        return self._check(await self._request("POST", url, json=body))

    async def patch(self, url: str, body: dict[str, Any] | list[Any]) -> dict[str, Any]:
        ctype = "application/json-patch+json" if isinstance(body, list) else "application/merge-patch+json"
        return self._check(await self._request("PATCH", url, json=body, headers={"Content-Type": ctype}))

    async def delete(self, url: str, grace_seconds: int | None = None) -> bool:
        """Delete (background propagation); False when it was already gone."""
        opts: dict[str, Any] = {"kind": "DeleteOptions", "apiVersion": "v1",
                                "propagationPolicy": "Background"}
        if grace_seconds is not None:
            opts["gracePeriodSeconds"] = grace_seconds
        resp = await self._request("DELETE", url, json=opts)
        if resp.status_code == 404:
            return False
        self._check(resp)
        return True

    async def event(self, owner: dict[str, Any], type_: str, reason: str, message: str) -> None:
        """Post a core/v1 Event about ``owner`` (a kopf body or a plain object dict)."""
        meta = owner["metadata"]
        now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        ns = meta.get("namespace") or "default"
        body = {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"name": f"{meta['name']}.{uuid.uuid4().hex[:16]}", "namespace": ns},
            "involvedObject": {"apiVersion": owner.get("apiVersion"), "kind": owner.get("kind"),
                               "name": meta["name"], "namespace": ns, "uid": meta.get("uid")},
            "type": type_, "reason": reason, "message": message[:1024],
            "firstTimestamp": now, "lastTimestamp": now, "count": 1,
            "source": {"component": "ttsfleet-operator"},
            "reportingComponent": "ttsfleet-operator", "reportingInstance": os.environ.get("HOSTNAME", ""),
        }
        await self.create(path("v1", "events", ns), body)
