"""Manifest parsing, sharding and the CLI's handling of bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from ttsfleet.fill_jobs.manifest import ShardSpec, load_manifest, parse_shard, shard_from_environment
from ttsfleet.fill_jobs.settings import DEFAULT_STAGES, parse_stages

from ttsfleet.errors import UserError


def write(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n")
    return path


def good(i: int) -> str:
    return json.dumps({"audio": f"a{i}.wav", "text": f"utterance {i}"})


@pytest.mark.parametrize("bad, needle", [
    ('{"audio": "x.wav", "text": "hi"', "not valid JSON"),
    ('["x.wav", "hi"]', "expected a JSON object"),
    ('{"text": "no audio"}', "missing field 'audio'"),
    ('{"audio": "x.wav"}', "missing field 'text'"),
    ('{"audio": "x.wav", "text": "hi", "id": "has space"}', "id"),
])
def test_malformed_line_is_named(tmp_path: Path, bad: str, needle: str) -> None:
    path = write(tmp_path / "m.jsonl", [good(0), "", good(1), bad, good(3)])
    with pytest.raises(UserError) as err:
        load_manifest(path)
    assert "line 4" in str(err.value) and needle in str(err.value)


def test_duplicate_ids_are_refused(tmp_path: Path) -> None:
    rows = [json.dumps({"audio": "a.wav", "text": "x", "id": "same"})] * 2
    with pytest.raises(UserError, match="line 2: duplicate id 'same'"):
        load_manifest(write(tmp_path / "m.jsonl", rows))


def test_aliases_keys_and_relative_paths(tmp_path: Path) -> None:
    path = write(tmp_path / "m.jsonl", [
        json.dumps({"audio_filepath": "sub/a.wav", "transcript": "hello", "speaker": 7}),
        json.dumps({"audio": "/abs/b.flac", "text": "world", "id": "b-1"}),
        json.dumps({"audio": "file:///abs/c.ogg", "text": "!"}),
    ])
    m = load_manifest(path)
    assert [e.key for e in m.entries] == ["item-00000000", "b-1", "item-00000002"]
    assert m.entries[0].item.speaker == "7"
    assert m.resolve(m.entries[0].item.audio) == str(tmp_path / "sub" / "a.wav")
    assert m.resolve(m.entries[1].item.audio) == "/abs/b.flac"
    assert m.resolve(m.entries[2].item.audio) == "/abs/c.ogg"


def test_shards_partition_the_manifest(tmp_path: Path) -> None:
    m = load_manifest(write(tmp_path / "m.jsonl", [good(i) for i in range(23)]))
    for n in (1, 2, 3, 7):
        parts = [ShardSpec(i, n).select(m.entries) for i in range(n)]
        positions = sorted(e.position for p in parts for e in p)
        assert positions == list(range(23))
        assert max(map(len, parts)) - min(map(len, parts)) <= 1


def test_shard_parsing_and_environment() -> None:
    assert parse_shard("2/5") == ShardSpec(2, 5)
    for bad in ("5/5", "1", "a/b", "-1/3", "0/0"):
        with pytest.raises(UserError):
            parse_shard(bad)
    assert shard_from_environment({}) is None
    assert shard_from_environment({"SLURM_ARRAY_TASK_ID": "7", "SLURM_ARRAY_TASK_MIN": "4",
                                   "SLURM_ARRAY_TASK_COUNT": "8"}) == ShardSpec(3, 8)
    k8s = {"JOB_COMPLETION_INDEX": "1", "TTSFLEET_FILL_SHARDS": "4"}
    assert shard_from_environment(k8s) == ShardSpec(1, 4)
    assert shard_from_environment({**k8s, "TTSFLEET_FILL_SHARD": "0/2"}) == ShardSpec(0, 2)
    with pytest.raises(UserError, match="TTSFLEET_FILL_SHARDS"):
        shard_from_environment({"JOB_COMPLETION_INDEX": "1"})


def test_stage_lists() -> None:
    assert parse_stages(None) == DEFAULT_STAGES
    assert parse_stages("hash") == ("decode", "hash")
    assert parse_stages("loudness,decode,vad") == ("decode", "vad", "loudness")
    with pytest.raises(UserError, match="unknown stage"):
        parse_stages("decode,denoise")


def test_cli_reports_malformed_line_without_traceback(tmp_path: Path) -> None:
    path = write(tmp_path / "m.jsonl", [good(0), '{"audio": 3'])
    proc = subprocess.run([sys.executable, "-m", "ttsfleet.cli", "fill", "run", "--input", str(path),
                           "--output", str(tmp_path / "o"), "--checkpoint", str(tmp_path / "c")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "line 2" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "o").exists() or not any((tmp_path / "o").rglob("*.flac"))
