"""The README's "Using the Fish Audio and OpenAI SDKs" snippets, run as written against a server.

Only the address and the key are swapped for the test server's; ``voice.wav`` is real speech
(espeak-ng where installed). A snippet that drifts from the SDKs or the server fails here.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import API_KEY, speech_wav

README = Path(__file__).resolve().parents[2] / "README.md"
SECTION = "## Using the Fish Audio and OpenAI SDKs"


def _snippets() -> list[str]:
    text = README.read_text()
    start = text.index(SECTION)
    section = text[start:text.index("\n## ", start + len(SECTION))]
    return re.findall(r"```python\n(.*?)```", section, flags=re.S)


def test_the_section_has_both_sdks():
    code = "\n".join(_snippets())
    assert "from fishaudio import" in code and "from openai import OpenAI" in code


@pytest.mark.parametrize("index", range(2), ids=["fish-audio-sdk", "openai"])
def test_snippet_runs(index, sdk_server, tmp_path):
    code = _snippets()[index]
    code = code.replace("http://127.0.0.1:8000", sdk_server.url).replace('"my-key"', repr(API_KEY))
    (tmp_path / "voice.wav").write_bytes(speech_wav("Hello."))
    check = ("\nfor name in [n for n in dir() if not n.startswith('_')]:\n"
             "    v = globals()[name]\n"
             "    if isinstance(v, bytes):\n"
             "        assert len(v) > 1000, (name, len(v))\n"
             "        print(name, len(v))\n")
    proc = subprocess.run([sys.executable, "-P", "-c", code + check], cwd=tmp_path, capture_output=True,
                          text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    produced = {line.split()[0] for line in proc.stdout.splitlines()}
    assert produced, proc.stdout
    if index == 0:
        assert {"wav", "cloned", "live"} <= produced and (tmp_path / "hello.mp3").stat().st_size > 1000
    else:
        assert {"mp3", "pcm"} <= produced
