"""The fill-stage registry: one place to add a stage, unknown stages refused before any work."""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from ttsfleet.fill_jobs import reasons, registry
from ttsfleet.fill_jobs.audio_io import AudioRejected
from ttsfleet.fill_jobs.runner import RunOptions, run_job
from ttsfleet.fill_jobs.settings import CleaningConfig, parse_stages


def test_registry_is_light_enough_for_the_operator() -> None:
    code = ("import sys, ttsfleet.fill_jobs.registry as r; r.validate(['vad']); "
            "print(sorted(m for m in ('torch', 'numpy', 'pydantic', 'soundfile') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_validate_orders_adds_decode_and_refuses_unknown_names() -> None:
    assert registry.validate(["codec", "loudness", "hash"]) == ("decode", "hash", "loudness", "codec")
    assert parse_stages("default") == registry.default_stages()
    with pytest.raises(registry.UnknownStage, match="unknown stage.s. denoise; known: decode"):
        registry.validate(["hash", "denoise"])
    assert isinstance(registry.UnknownStage("x"), ValueError)  # pydantic validators may raise it
    assert registry.check(["loudness", "vad"]) == ["loudness", "vad"]


def test_a_pydantic_model_refuses_an_unknown_stage_through_the_registry() -> None:
    """How the operator validates a FillJob's stages: the registry inside a field validator."""
    from pydantic import BaseModel, ValidationError, field_validator

    class Spec(BaseModel):
        stages: list[str] = []

        @field_validator("stages")
        @classmethod
        def _known(cls, v: list[str]) -> list[str]:
            return registry.check(v)

    assert Spec(stages=["vad", "codec"]).stages == ["vad", "codec"]
    with pytest.raises(ValidationError, match="unknown stage.s. denoise"):
        Spec(stages=["vad", "denoise"])
    with pytest.raises(ValueError, match="already registered"):
        registry.register(registry.Stage("vad", "again", 1, "x:y"))


def test_cli_refuses_an_unknown_stage_with_one_line(tmp_path: Path) -> None:
    (tmp_path / "m.jsonl").write_text('{"audio": "a.wav", "text": "hi"}\n')
    proc = subprocess.run([sys.executable, "-P", "-m", "ttsfleet.cli", "fill", "run", "-i",
                           str(tmp_path / "m.jsonl"), "-o", str(tmp_path / "o"), "-c",
                           str(tmp_path / "c"), "--stages", "decode,denoise"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "denoise" in proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "o").exists()


# --- a toy stage of each kind, registered in one place ----------------------------------------
class QuietGate:
    """Toy item stage: measures the peak and rejects clips quieter than -30 dBFS."""

    def __init__(self, config: CleaningConfig) -> None:
        self.config = config

    def run(self, w) -> None:
        peak = float(np.max(np.abs(w.audio)))
        w.metrics["toy_peak"] = round(peak, 4)
        if peak < 10 ** (-30 / 20):
            raise AudioRejected(reasons.SILENCE_ONLY, "toy: too quiet")


class SampleCount:
    """Toy batch stage: one text file per output holding its sample count."""

    def __init__(self, config: CleaningConfig, device: str | None = None) -> None:
        self.config = config

    def process(self, results: list) -> None:
        for r in results:
            for k, clip in enumerate(r.clips if r.accepted else []):
                name = f"toy/{r.key}.{k}.txt"
                r.files.append((name, str(len(clip)).encode()))
                r.row["outputs"][k]["toy"] = name


@pytest.fixture
def toy_stages():
    registry.register(registry.Stage("quiet_gate", "toy", 25, QuietGate))
    registry.register(registry.Stage("sample_count", "toy", 200, SampleCount, kind="batch"))
    yield
    registry.unregister("quiet_gate")
    registry.unregister("sample_count")


@pytest.mark.audio
@pytest.mark.parametrize("workers", [0, 1])
def test_toy_stages_run_in_a_fill_job(toy_stages, clean_corpus: Path, tmp_path: Path, workers: int) -> None:
    stages = parse_stages("hash,quiet_gate,sample_count")
    assert stages == ("decode", "hash", "quiet_gate", "sample_count")
    opts = RunOptions(input=clean_corpus, output=tmp_path / "out", checkpoint=tmp_path / "ckpt",
                      stages=stages, checkpoint_every_items=3, interactive=False,
                      config=CleaningConfig(workers=workers, batch_items=4))
    with contextlib.redirect_stderr(io.StringIO()):
        assert run_job(opts) == 0
    rows = [json.loads(line) for line in next((tmp_path / "out").glob("manifest.*.jsonl")).open()]
    assert len(rows) == 10 and all(r["status"] == "accepted" for r in rows)
    for r in rows:
        assert r["metrics"]["toy_peak"] > 0.03
        (out,) = r["outputs"]
        count = int((tmp_path / "out" / out["toy"]).read_text())
        assert abs(count - out["seconds"] * CleaningConfig().target_rate) <= 2  # seconds: 4 decimals
