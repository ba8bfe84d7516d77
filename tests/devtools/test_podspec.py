"""The process kubelet's pure rules: a pod's env, argv and mounts as a process sees them, its status,
and the wildcard-bind shim. Fast; the kubelet against a real control plane is test_kubelet.py."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from ttsfleet.devtools import podnet
from ttsfleet.devtools.podspec import (
    ContainerConfigError,
    Mount,
    PodInputs,
    container_env,
    expand,
    host_path,
    mounts,
    port_number,
    process_env,
    resolve_argv,
)
from ttsfleet.devtools.podstatus import ContainerRecord, PodView, exit_code, phase, pod_status

POD = {"metadata": {"name": "p", "namespace": "ns", "uid": "u-1", "labels": {"app": "tts"}},
       "spec": {"nodeName": "n1", "serviceAccountName": "sa",
                "volumes": [{"name": "ckpt"}, {"name": "cat"}]}}


def test_env_follows_kubernetes_order_and_sources() -> None:
    c = {"name": "c", "envFrom": [{"configMapRef": {"name": "base"}, "prefix": "B_"}],
         "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "$(A)-$(NOPE)-$$(A)"},
                 {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                 {"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                 {"name": "APP", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['app']"}}},
                 {"name": "K", "valueFrom": {"configMapKeyRef": {"name": "base", "key": "k"}}},
                 {"name": "S", "valueFrom": {"secretKeyRef": {"name": "s", "key": "pw"}}},
                 {"name": "O", "valueFrom": {"secretKeyRef": {"name": "x", "key": "y", "optional": True}}}]}
    inputs = PodInputs(configmaps={"base": {"k": "v"}}, secrets={"s": {"pw": "hunter2"}})
    env = container_env(POD, c, "127.9.128.1", inputs)
    assert env["B_k"] == "v" and env["A"] == "1" and env["B"] == "1-$(NOPE)-$(A)"
    got = (env["POD"], env["IP"], env["APP"], env["K"], env["S"])
    assert got == ("p", "127.9.128.1", "tts", "v", "hunter2")
    assert "O" not in env and env["HOSTNAME"] == "p"


def test_a_missing_key_is_a_config_error_not_an_empty_value() -> None:
    c = {"name": "c", "env": [{"name": "K", "valueFrom": {"configMapKeyRef": {"name": "gone", "key": "k"}}}]}
    with pytest.raises(ContainerConfigError, match="ConfigMap 'gone' not found"):
        container_env(POD, c, "127.0.0.2", PodInputs())


def test_mount_paths_become_host_paths_longest_first() -> None:
    c = {"name": "c", "volumeMounts": [{"name": "ckpt", "mountPath": "/checkpoints"},
                                       {"name": "cat", "mountPath": "/checkpoints/catalog/"}]}
    table = mounts(POD, c, PodInputs(volumes={"ckpt": "/h/ckpt", "cat": "/h/cat"}))
    assert [m.path for m in table] == ["/checkpoints/catalog", "/checkpoints"]
    assert host_path("/checkpoints/job/shard-00000", table) == "/h/ckpt/job/shard-00000"
    assert host_path("/checkpoints/catalog/x.yaml", table) == "/h/cat/x.yaml"
    assert host_path("--out=/checkpoints", table) == "--out=/h/ckpt"
    assert host_path("/checkpointsX", table) == "/checkpointsX"  # a prefix, not a path under it
    assert host_path("relative/checkpoints", table) == "relative/checkpoints"


def test_argv_is_command_and_args_expanded_with_the_executable_on_path(tmp_path: Path) -> None:
    exe = tmp_path / "tool"
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    table = [Mount("/data", "/h/data")]
    c = {"name": "c", "command": ["tool", "--in"], "args": ["/data/$(FILE)", "--n=$(N)"]}
    argv = resolve_argv(c, {"PATH": str(tmp_path), "FILE": "m.jsonl", "N": "3"}, table)
    assert argv == [str(exe), "--in", "/h/data/m.jsonl", "--n=3"]
    with pytest.raises(ContainerConfigError, match="no command"):
        resolve_argv({"name": "c", "args": ["x"]}, {"PATH": str(tmp_path)}, table)
    with pytest.raises(ContainerConfigError, match="not found on PATH"):
        resolve_argv({"name": "c", "command": ["nope"]}, {"PATH": str(tmp_path)}, table)


def test_process_env_hands_the_token_over_as_a_kubeconfig() -> None:
    env = process_env({"PATH": "/bin", "KUBERNETES_SERVICE_HOST": "10.0.0.1"}, {"CATALOG": "/cat/c.yaml"},
                      [Mount("/cat", "/h/cat")], PodInputs(kubeconfig="/sandbox/kubeconfig"))
    assert env == {"PATH": "/bin", "CATALOG": "/h/cat/c.yaml", "KUBECONFIG": "/sandbox/kubeconfig"}


def test_named_probe_ports() -> None:
    c = {"name": "c", "ports": [{"name": "http", "containerPort": 8000}]}
    assert port_number(c, "http") == 8000 and port_number(c, 9) == 9 and port_number(c, "81") == 81
    with pytest.raises(ContainerConfigError):
        port_number(c, "metrics")


def test_expand_leaves_undefined_variables() -> None:
    assert expand("$(A)$(B)$$", {"A": "x"}) == "x$(B)$"


def test_status_phase_ready_and_exit_codes() -> None:
    view = PodView("127.1.128.1", start_time="2026-12-01T00:00:00Z")
    r = ContainerRecord("server")
    assert phase([r]) == "Pending"
    r.state, r.readiness = "running", None
    s1 = pod_status([r], view)
    assert s1["phase"] == "Running" and s1["podIP"] == "127.1.128.1"
    assert {c["type"]: c["status"] for c in s1["conditions"]}["Ready"] == "False"
    r.readiness = True
    s2 = pod_status([r], view, s1)
    assert {c["type"]: c["status"] for c in s2["conditions"]}["Ready"] == "True"
    scheduled = [c for c in s2["conditions"] if c["type"] == "PodScheduled"]
    assert scheduled == [c for c in s1["conditions"] if c["type"] == "PodScheduled"]  # time kept
    r.state, r.exit_code = "terminated", exit_code(99)
    assert phase([r]) == "Failed" and pod_status([r], view)["containerStatuses"][0]["state"][
        "terminated"]["exitCode"] == 99
    r.exit_code = 0
    assert phase([r]) == "Succeeded"
    assert exit_code(-9) == 137 and exit_code(-15) == 143


def test_wildcard_addresses_bind_the_pod_ip() -> None:
    assert podnet.pod_address(("0.0.0.0", 80), socket.AF_INET, "127.5.128.1") == ("127.5.128.1", 80)
    assert podnet.pod_address(("", 80), socket.AF_INET, "127.5.128.1") == ("127.5.128.1", 80)
    assert podnet.pod_address(("::", 80, 0, 0), socket.AF_INET6, "127.5.128.1")[0] == "::ffff:127.5.128.1"
    assert podnet.pod_address(("127.0.0.1", 80), socket.AF_INET, "127.5.128.1") == ("127.0.0.1", 80)


def test_the_shim_works_as_sitecustomize_in_a_fresh_process(tmp_path: Path) -> None:
    podnet.install_file(tmp_path)
    code = ("import socket; s = socket.socket(); s.bind(('0.0.0.0', 0)); print(s.getsockname()[0])")
    env = {**os.environ, "PYTHONPATH": str(tmp_path), podnet.POD_IP_ENV: "127.42.128.7"}
    out = subprocess.run([sys.executable, "-P", "-c", code], env=env, capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "127.42.128.7"
