"""A pod's volumes as host directories, prepared by the process kubelet before its containers start.

Each volume becomes a directory (or a path the API names) that :mod:`ttsfleet.devtools.podspec`
substitutes for its mount path:

* ``emptyDir`` — a fresh directory in the pod's sandbox (``medium: Memory`` too), removed with it;
* ``configMap``, ``secret``, ``downwardAPI`` and ``projected`` (with ``serviceAccountToken``: a
  real bound token from the TokenRequest API) — their files written into the sandbox at start
  (not refreshed while the pod runs);
* ``persistentVolumeClaim`` — the bound PersistentVolume's ``hostPath``/``local`` path, so pods
  sharing a claim share its files, as on a ReadWriteMany volume; an unbound claim keeps the pod
  Pending;
* ``hostPath`` — the path itself.

Anything else is refused with a reason (the pod stays Pending). A missing ConfigMap or Secret
that is not ``optional`` also keeps the pod Pending until it appears, as on a kubelet.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from ttsfleet.devtools.podspec import SA_MOUNT, ContainerConfigError, PodInputs, field_ref

#: The automounted token's lifetime when the projection names none (the API server's default).
TOKEN_SECONDS = 3607


class Api(Protocol):
    async def get_json(self, path: str) -> dict[str, Any] | None: ...
    async def post_json(self, path: str, body: dict[str, Any]) -> dict[str, Any]: ...
    @property
    def server(self) -> str: ...
    @property
    def ca_file(self) -> str: ...


def _decode(data: Mapping[str, str]) -> dict[str, str]:
    return {k: base64.b64decode(v).decode(errors="replace") for k, v in data.items()}


async def configmap(api: Api, namespace: str, name: str) -> dict[str, str] | None:
    obj = await api.get_json(f"/api/v1/namespaces/{namespace}/configmaps/{name}")
    if obj is None:
        return None
    return {**(obj.get("data") or {}), **_decode(obj.get("binaryData") or {})}


async def secret(api: Api, namespace: str, name: str) -> dict[str, str] | None:
    obj = await api.get_json(f"/api/v1/namespaces/{namespace}/secrets/{name}")
    return None if obj is None else _decode(obj.get("data") or {})


def _write(directory: Path, files: Mapping[str, str]) -> None:
    for rel, text in files.items():
        target = directory / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)


def _select(kind: str, name: str, data: dict[str, str] | None, items: list[dict[str, Any]] | None,
            optional: bool) -> dict[str, str]:
    """The files a ConfigMap/Secret source projects (all keys, or ``items`` key -> path)."""
    if data is None:
        if optional:
            return {}
        raise ContainerConfigError(f"{kind} {name!r} not found")
    if not items:
        return dict(data)
    out = {}
    for item in items:
        if item["key"] not in data:
            if optional:
                continue
            raise ContainerConfigError(f"{kind} {name!r} has no key {item['key']!r}")
        out[item["path"]] = data[item["key"]]
    return out


async def _token(api: Api, pod: Mapping[str, Any], src: Mapping[str, Any]) -> str:
    meta = pod["metadata"]
    sa = (pod.get("spec") or {}).get("serviceAccountName") or "default"
    spec: dict[str, Any] = {"expirationSeconds": int(src.get("expirationSeconds") or TOKEN_SECONDS),
                            "boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": meta["name"],
                                               "uid": meta["uid"]}}
    if src.get("audience"):
        spec["audiences"] = [src["audience"]]
    body = await api.post_json(f"/api/v1/namespaces/{meta['namespace']}/serviceaccounts/{sa}/token",
                               {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                                "spec": spec})
    return str(body["status"]["token"])


def _downward(pod: Mapping[str, Any], items: list[dict[str, Any]], ip: str) -> dict[str, str]:
    return {i["path"]: field_ref(pod, i["fieldRef"]["fieldPath"], ip) for i in items if "fieldRef" in i}


async def _projected(api: Api, pod: Mapping[str, Any], sources: list[dict[str, Any]],
                     ip: str) -> tuple[dict[str, str], str]:
    ns = pod["metadata"]["namespace"]
    files: dict[str, str] = {}
    token = ""
    for src in sources:
        if "serviceAccountToken" in src:
            token = await _token(api, pod, src["serviceAccountToken"])
            files[src["serviceAccountToken"].get("path", "token")] = token
        elif "configMap" in src:
            ref = src["configMap"]
            files.update(_select("ConfigMap", ref["name"], await configmap(api, ns, ref["name"]),
                                 ref.get("items"), bool(ref.get("optional"))))
        elif "secret" in src:
            ref = src["secret"]
            files.update(_select("Secret", ref["name"], await secret(api, ns, ref["name"]),
                                 ref.get("items"), bool(ref.get("optional"))))
        elif "downwardAPI" in src:
            files.update(_downward(pod, src["downwardAPI"].get("items") or [], ip))
        else:
            raise ContainerConfigError(f"projected source {sorted(src)} is not supported")
    return files, token


async def _claim_path(api: Api, namespace: str, claim: str) -> str:
    pvc = await api.get_json(f"/api/v1/namespaces/{namespace}/persistentvolumeclaims/{claim}")
    if pvc is None:
        raise ContainerConfigError(f"PersistentVolumeClaim {claim!r} not found")
    volume = (pvc.get("spec") or {}).get("volumeName")
    if (pvc.get("status") or {}).get("phase") != "Bound" or not volume:
        raise ContainerConfigError(f"PersistentVolumeClaim {claim!r} is not bound")
    pv = await api.get_json(f"/api/v1/persistentvolumes/{volume}") or {}
    spec = pv.get("spec") or {}
    source = spec.get("hostPath") or spec.get("local")
    if not source:
        raise ContainerConfigError(f"PersistentVolume {volume!r} is neither hostPath nor local")
    Path(source["path"]).mkdir(parents=True, exist_ok=True)
    return str(source["path"])


def kubeconfig(server: str, ca_file: str, token: str, user: str) -> str:
    return json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "pod",
        "clusters": [{"name": "local", "cluster": {"server": server, "certificate-authority": ca_file}}],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": "pod", "context": {"cluster": "local", "user": user}}],
    })


async def prepare(api: Api, pod: Mapping[str, Any], sandbox: Path, pod_ip: str) -> PodInputs:
    """Every volume of ``pod`` on disk under ``sandbox``, and the ConfigMaps/Secrets its env reads."""
    ns = pod["metadata"]["namespace"]
    spec = pod.get("spec") or {}
    inputs = PodInputs()
    for vol in spec.get("volumes") or []:
        name = vol["name"]
        directory = sandbox / "volumes" / name
        if "persistentVolumeClaim" in vol:
            inputs.volumes[name] = await _claim_path(api, ns, vol["persistentVolumeClaim"]["claimName"])
            continue
        if "hostPath" in vol:
            inputs.volumes[name] = vol["hostPath"]["path"]
            continue
        directory.mkdir(parents=True, exist_ok=True)
        inputs.volumes[name] = str(directory)
        if "emptyDir" in vol:
            continue
        if "configMap" in vol:
            ref = vol["configMap"]
            _write(directory, _select("ConfigMap", ref["name"], await configmap(api, ns, ref["name"]),
                                      ref.get("items"), bool(ref.get("optional"))))
        elif "secret" in vol:
            ref = vol["secret"]
            _write(directory, _select("Secret", ref["secretName"], await secret(api, ns, ref["secretName"]),
                                      ref.get("items"), bool(ref.get("optional"))))
        elif "downwardAPI" in vol:
            _write(directory, _downward(pod, vol["downwardAPI"].get("items") or [], pod_ip))
        elif "projected" in vol:
            files, token = await _projected(api, pod, vol["projected"].get("sources") or [], pod_ip)
            _write(directory, files)
            if token and _mounted_at(spec, name, SA_MOUNT):
                sa = spec.get("serviceAccountName") or "default"
                path = sandbox / "kubeconfig"
                path.write_text(kubeconfig(api.server, api.ca_file, token,
                                           f"system:serviceaccount:{ns}:{sa}"))
                inputs.kubeconfig = str(path)
        else:
            kinds = sorted(k for k in vol if k != "name")
            raise ContainerConfigError(f"volume {name!r}: {kinds} is not supported by this kubelet")
    await _env_sources(api, pod, inputs)
    return inputs


def _mounted_at(spec: Mapping[str, Any], volume: str, path: str) -> bool:
    return any(vm["name"] == volume and vm["mountPath"].rstrip("/") == path
               for c in spec.get("containers") or [] for vm in c.get("volumeMounts") or [])


async def _env_sources(api: Api, pod: Mapping[str, Any], inputs: PodInputs) -> None:
    """Fetch the ConfigMaps and Secrets the containers' env and envFrom name (missing: left out)."""
    ns = pod["metadata"]["namespace"]
    cms, secs = set(), set()
    for c in (pod.get("spec") or {}).get("containers") or []:
        for src in c.get("envFrom") or []:
            if "configMapRef" in src:
                cms.add(src["configMapRef"]["name"])
            if "secretRef" in src:
                secs.add(src["secretRef"]["name"])
        for var in c.get("env") or []:
            ref = var.get("valueFrom") or {}
            if "configMapKeyRef" in ref:
                cms.add(ref["configMapKeyRef"]["name"])
            if "secretKeyRef" in ref:
                secs.add(ref["secretKeyRef"]["name"])
    for name in cms:
        data = await configmap(api, ns, name)
        if data is not None:
            inputs.configmaps[name] = data
    for name in secs:
        data = await secret(api, ns, name)
        if data is not None:
            inputs.secrets[name] = data
