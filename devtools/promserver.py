"""Start a real Prometheus on backfilled data and query it (for tests and the PNG renderer).

Debian's ``prometheus`` and ``promtool`` binaries are used as they are: OpenMetrics text is turned
into TSDB blocks with ``promtool tsdb create-blocks-from openmetrics``, Prometheus is started on
that directory on a free 127.0.0.1 port, and queries carry an explicit ``time=`` so results do
not depend on the wall clock.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from ttsfleet.devtools.ports import free_port

from ttsfleet.errors import UserError


def binaries() -> tuple[str, str]:
    prom, tool = shutil.which("prometheus"), shutil.which("promtool")
    if not prom or not tool:
        raise UserError("prometheus and promtool are needed (apt-get install prometheus)")
    return prom, tool


def backfill(openmetrics: str, workdir: Path) -> Path:
    """Write ``openmetrics`` to TSDB blocks under ``workdir/data``; returns the data directory."""
    _, tool = binaries()
    workdir.mkdir(parents=True, exist_ok=True)
    src, data = workdir / "input.om", workdir / "data"
    src.write_text(openmetrics)
    proc = subprocess.run([tool, "tsdb", "create-blocks-from", "openmetrics", str(src), str(data)],
                          capture_output=True, text=True)
    src.unlink()
    if proc.returncode != 0:
        raise RuntimeError(f"promtool backfill failed: {proc.stderr.strip()[-2000:]}")
    return data


class Prometheus:
    """A Prometheus process on ``data_dir``; use as a context manager, it is always killed."""

    def __init__(self, data_dir: Path, config: str = "global:\n  scrape_interval: 15s\n",
                 rule_files: tuple[Path, ...] = ()) -> None:
        self.data_dir = data_dir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cfg = config
        if rule_files:
            cfg += "rule_files:\n" + "".join(f"  - {p}\n" for p in rule_files)
        self.config_path = data_dir.parent / "prometheus.yml"
        self.config_path.write_text(cfg)
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Prometheus:
        prom, _ = binaries()
        self.log = open(self.data_dir.parent / "prometheus.log", "wb")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [prom, f"--config.file={self.config_path}", f"--storage.tsdb.path={self.data_dir}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--storage.tsdb.retention.time=100y",
             "--web.enable-lifecycle"], stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"prometheus exited: {self._log_tail()}")
            try:
                with urllib.request.urlopen(self.url + "/-/ready", timeout=1) as r:
                    if r.status == 200:
                        return self
            except OSError:
                time.sleep(0.1)
        self.__exit__(None, None, None)
        raise RuntimeError(f"prometheus not ready after 30 s: {self._log_tail()}")

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()

    def _log_tail(self) -> str:
        self.log.flush()
        return (self.data_dir.parent / "prometheus.log").read_text(errors="replace")[-2000:]

    def api(self, path: str, **params: Any) -> Any:
        """GET ``/api/v1/<path>``; returns ``data`` or raises with Prometheus' error text."""
        q = urllib.parse.urlencode(params, doseq=True)
        try:
            with urllib.request.urlopen(f"{self.url}/api/v1/{path}?{q}", timeout=30) as r:
                body = json.load(r)
        except urllib.error.HTTPError as e:
            body = json.load(e)
        if body.get("status") != "success":
            raise ValueError(f"{body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, expr: str, at: float) -> list[dict[str, Any]]:
        """Instant query at ``at``; a list of ``{"metric": {...}, "value": float}``."""
        data = self.api("query", query=expr, time=at)
        if data["resultType"] == "scalar":
            return [{"metric": {}, "value": float(data["result"][1])}]
        return [{"metric": r["metric"], "value": float(r["value"][1])} for r in data["result"]]

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
        data = self.api("query_range", query=expr, start=start, end=end, step=step)
        return [{"metric": r["metric"], "values": [(float(t), float(v)) for t, v in r["values"]]}
                for r in data["result"]]
