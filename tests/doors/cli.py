"""The real ``ttsfleet`` command-line parser, for door tests: parse an argv as the process would,
without running the command."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pytest
import typer


def command(*path: str) -> Any:
    """The click command at ``ttsfleet <path...>`` (typer builds it from the same app `main` runs)."""
    from ttsfleet.cli import app

    cmd = typer.main.get_command(app)
    for name in path:
        cmd = cmd.commands[name]  # type: ignore[attr-defined]
    return cmd


def parse(path: Sequence[str], argv: Sequence[str], env: Mapping[str, str],
          monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """``ttsfleet <path> <argv>`` parsed with ``env`` as the process environment (options with an
    ``envvar`` read it); returns the parameters, or raises the parser's usage error."""
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    cmd = command(*path)
    return dict(cmd.make_context(" ".join(["ttsfleet", *path]), list(argv)).params)
