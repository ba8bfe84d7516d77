"""``ttsfleet operator`` commands, including ``run`` as a real process with its health and metrics ports."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import yaml
from ttsfleet.devtools.ports import free_port
from ttsfleet.operator.cli import app
from ttsfleet.operator.crds import crd_documents
from typer.testing import CliRunner

from tests.operator.helpers import DEPLOY, live, ttsd
from ttsfleet.catalog import GpuCatalog
from ttsfleet.cli import main

CAT = GpuCatalog.default()

runner = CliRunner()


def test_crds_write_then_check(tmp_path: Path) -> None:
    out = tmp_path / "crds"
    assert runner.invoke(app, ["crds", "--out", str(out)]).exit_code == 0
    assert sorted(p.name for p in out.iterdir()) == sorted(crd_documents(CAT))
    assert runner.invoke(app, ["crds", "--out", str(out), "--check"]).exit_code == 0
    (out / "filljobs.ttsfleet.io.yaml").write_text("stale")
    result = runner.invoke(app, ["crds", "--out", str(out), "--check"])
    assert result.exit_code == 1


def test_render_prints_objects(tmp_path: Path) -> None:
    manifest = tmp_path / "t.yaml"
    manifest.write_text(yaml.safe_dump(ttsd()))
    result = runner.invoke(app, ["render", str(manifest)])
    assert result.exit_code == 0, result.output
    kinds = [d["kind"] for d in yaml.safe_load_all(result.output)]
    assert kinds.count("Deployment") == 2 and kinds.count("Service") == 3


def test_bad_input_is_one_line_exit_2(tmp_path: Path, capsys) -> None:
    bad = ttsd()
    bad["spec"]["pools"][0]["gpuClass"] = "a100"
    manifest = tmp_path / "bad.yaml"
    manifest.write_text(yaml.safe_dump(bad))
    assert main(["operator", "render", str(manifest)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "gpuClass" in err and len(err.strip().splitlines()) == 1
    assert main(["operator", "render", str(tmp_path / "missing.yaml")]) == 2
    assert main(["operator", "run", "--metrics-port", "8080", "--health-port", "8080"]) == 2
    assert main(["operator", "run", "--leader-elect", "--lease-namespace", "ops",
                 "--lease-duration", "5", "--renew-deadline", "6"]) == 2  # deadline must be shorter


async def test_operator_run_process_serves_health_and_metrics(cluster) -> None:
    metrics_port, health_port = free_port(), free_port()
    code = "from ttsfleet.operator.cli import app; app()"
    proc = subprocess.Popen(
        [sys.executable, "-c", code, "run", "--metrics-port", str(metrics_port),
         "--health-port", str(health_port), "--namespace", "ns1", "--autoscale-interval", "3600"],
        env={**os.environ}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        async with httpx.AsyncClient() as client:
            for _ in range(200):
                try:
                    health = await client.get(f"http://127.0.0.1:{health_port}/healthz")
                    if health.status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                assert proc.poll() is None, proc.stdout.read().decode()[-2000:]
                await asyncio.sleep(0.1)
            assert health.status_code == 200
            await cluster.post("/apis/ttsfleet.io/v1alpha1/namespaces/ns1/ttsdeployments", json=ttsd())
            for _ in range(200):
                if live(cluster, DEPLOY, "ns1", "voice-h200"):
                    break
                await asyncio.sleep(0.1)
            assert live(cluster, DEPLOY, "ns1", "voice-h200")
            text = (await client.get(f"http://127.0.0.1:{metrics_port}/metrics")).text
            assert "# TYPE ttsfleet_operator_replicas_desired gauge" in text
            assert "# TYPE ttsfleet_gpus gauge" in text
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
    assert proc.returncode == 0, proc.stdout.read().decode()[-2000:]
