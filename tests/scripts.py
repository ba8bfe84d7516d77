"""Benchmark scripts (``benchmarks/...``, not a package) loaded as modules for their CPU tests."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]


def load_script(relative: str) -> ModuleType:
    """The script at ``relative`` (from the repo root) as a module named after its file. Registered in
    ``sys.modules`` while it runs, as an import would be: dataclasses look their module up there. The
    root joins the end of ``sys.path`` so the script's own ``benchmarks.…`` imports resolve."""
    path = ROOT / relative
    if str(ROOT) not in sys.path:  # a script's `from benchmarks.… import` (the device runs them as
        sys.path.append(str(ROOT))  # `python3 -m` from the root); appended, so stdlib `operator` stays first
    spec = importlib.util.spec_from_file_location(f"bench_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
