"""Shared test configuration: skip GPU/system-service tests cleanly where they cannot run."""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import shutil
import sys
import threading

import pytest


def _interpret_triton_without_a_gpu() -> None:
    """Without CUDA the kernel tests run Triton's interpreter, which Triton takes from
    ``TRITON_INTERPRET`` as it is imported: ``triton.language``'s own functions are decorated then.
    Each interpreter test module sets it at its top, but a module collected before them that imports
    triton (``torch._dynamo`` does) would decorate those functions for compiling, and every
    interpreted kernel then fails on its first ``tl.sum`` (108 tests of a clean-clone run on
    2026-12-03, after a codec test imported ``torch._dynamo.testing``). Set here, before any test
    module is collected. Importing torch does not import triton."""
    try:
        import torch
    except ImportError:
        return
    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")


_interpret_triton_without_a_gpu()


SANITIZE_OVERFLOW = "TTSFLEET_TRITON_SANITIZE_OVERFLOW"


def _interpreter_without_overflow_checks() -> None:
    """Triton's interpreter checks every 32-bit integer add / sub / mul of a kernel for overflow
    (``InterpreterOptions.sanitize_overflow``, one int64 recomputation + a device assert per op):
    half the time of an index-heavy kernel such as the codec's Snake, a quarter of a GEMM's. A
    compiled kernel has no such check unless built with ``debug``, and at the tests' tiny shapes no
    index comes near 2**31; a wrong one still shows as a wrong result. So off here; set
    ``TTSFLEET_TRITON_SANITIZE_OVERFLOW=1`` to have it back. The interpreter's options are one
    module-level builder's, read as each kernel runs: patched before the first test that has torch
    loaded (triton's import is cheap then, and safe: ``TRITON_INTERPRET`` is set above)."""
    if os.environ.get("TRITON_INTERPRET") != "1" or os.environ.get(SANITIZE_OVERFLOW) == "1":
        return
    interp = sys.modules.get("triton.runtime.interpreter")
    if interp is None:
        if "torch" not in sys.modules or importlib.util.find_spec("triton") is None:
            return
        import triton.runtime.interpreter as interp
    builder = getattr(interp, "interpreter_builder", None)
    options = getattr(builder, "options", None)
    if getattr(options, "sanitize_overflow", False):
        builder.options = dataclasses.replace(options, sanitize_overflow=False)


_grid_patch = threading.local()  # per thread: what the running kernel's patch covers (see below)


def _interpreter_patches_the_language_once_per_launch() -> None:
    """Triton's interpreter swaps ``triton.language``'s builtins (and a few of ``tl.core``'s) for
    interpreted ones at each kernel launch (``GridExecutor.__call__``: ``_patch_lang``, restored
    after the grid), and again at every call of a ``@triton.jit`` helper inside the kernel
    (``InterpretedFunction.__call__``), per program of the grid: ~1 ms of ``inspect.getmembers``
    over the language modules each time, never restored. A patch over modules already patched by the
    running launch changes nothing (every builtin is already replaced; the rest is set to equivalent
    stateless functions, and the launch's restore puts the originals back either way), and was ~40 %
    of an interpreted decode step (2026-12-07, a mixed-step test: 41,292 patches for 978 launches).
    So a helper's patch is skipped while the launch running in this thread has patched every
    language module the helper sees; any other patch (a launch, a helper seeing ``tl.core`` where
    the kernel saw only ``tl``, one seeing neither, which Triton refuses, a call outside a launch)
    runs as Triton wrote it."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        return
    interp = sys.modules.get("triton.runtime.interpreter")
    if interp is None or getattr(interp, "_ttsfleet_patch_once", False):
        return
    if not all(hasattr(interp, name) for name in ("_patch_lang", "_LangPatchScope", "GridExecutor", "tl")):
        return  # another Triton than the one this was written against (3.7): leave it as it is
    tl = interp.tl
    original_patch, original_launch = interp._patch_lang, interp.GridExecutor.__call__

    def langs(fn: object) -> frozenset[int]:
        return frozenset(id(v) for v in fn.__globals__.values() if v is tl or v is tl.core)  # type: ignore[attr-defined]

    def patch_lang(fn):  # noqa: ANN001, ANN202
        covered = getattr(_grid_patch, "covered", None)
        if covered is None:  # outside a launch: as Triton does
            return original_patch(fn)
        seen = langs(fn)
        if seen and covered[0] is not None and seen <= covered[0]:
            return interp._LangPatchScope()  # nothing to patch, nothing to restore
        scope = original_patch(fn)
        covered[0] = seen if covered[0] is None else covered[0] | seen
        return scope

    def launch(self, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        outer = getattr(_grid_patch, "covered", None)
        _grid_patch.covered = [None]  # the launch's own _patch_lang comes first and runs in full
        try:
            return original_launch(self, *args, **kwargs)
        finally:
            _grid_patch.covered = outer

    interp._patch_lang = patch_lang
    interp.GridExecutor.__call__ = launch
    interp._ttsfleet_patch_once = True


@pytest.fixture(autouse=True)
def _fast_triton_interpreter():  # noqa: ANN202
    _interpreter_without_overflow_checks()
    _interpreter_patches_the_language_once_per_launch()
    yield


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    cuda = False
    try:
        import torch

        cuda = torch.cuda.is_available()
    except Exception:  # torch not installed: GPU tests skip
        cuda = False
    skip_gpu = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords and not cuda:
            item.add_marker(skip_gpu)
        if "audio" in item.keywords and shutil.which("espeak-ng") is None:
            item.add_marker(pytest.mark.skip(reason="needs espeak-ng (installed by .ci/run)"))
