"""The recorded served H200 run the built-in catalog curve comes from, read the way the tests need.

Why one reader: the catalog test checks the curve point by point against this run and the simulator
test derives the autoscaler's sizing from it; both read the same ``served.tgz``.
"""

from __future__ import annotations

import json
import tarfile
from functools import cache
from pathlib import Path

#: The run behind ``ttsfleet/catalog.py``'s ``_SERVED_H200``.
SERVED_RUN = (Path(__file__).resolve().parents[1]
              / "benchmarks/inference_h200/2026-12-04/run15-served-curve-final-defaults")


@cache
def served_members() -> dict[str, bytes]:
    """Every file of the run's ``served.tgz`` by name."""
    with tarfile.open(SERVED_RUN / "served.tgz") as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}


def served_points() -> dict[int, dict]:
    """The run's ``bench.json`` points by concurrency (each level's server was an H200 class)."""
    out = {}
    for name, data in served_members().items():
        if name.endswith("/bench.json"):
            doc = json.loads(data)
            assert doc["server"]["build"]["gpu_class"] == "h200"
            out.update({p["concurrency"]: p for p in doc["points"]})
    return out


def nvml_busy(c: int) -> float:
    """speed_run.sh's reading: mean NVML utilization over the middle 80 % of a level's samples."""
    v = [float(x) for x in served_members()[f"./serve/nvml_c{c}.txt"].decode().split() if x.strip()]
    v = v[len(v) // 10:len(v) - len(v) // 10] or v
    return sum(v) / len(v) / 100
