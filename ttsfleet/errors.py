"""User-facing errors: bad input becomes one readable line and exit code 2, never a traceback.

Raise :class:`UserError` (or a subclass) from any CLI code path for input the user can fix; the
root CLI catches it. HTTP services map their own errors to 4xx JSON bodies instead.
"""

from __future__ import annotations

from typing import Any


class UserError(Exception):
    """Input the user can fix: a malformed file, an unknown name, a negative count."""

    exit_code = 2


def one_line(exc: BaseException) -> str:
    """An exception message on one line for a terminal: multi-line messages are joined (at most
    500 characters)."""
    lines = [line.strip() for line in (str(exc).strip() or type(exc).__name__).splitlines()]
    lines = [line for line in lines if line]
    return lines[0] if len(lines) == 1 else " ".join(lines)[:500]


def validation_text(exc: Any, limit: int | None = None, root: str = "input") -> str:
    """A pydantic ``ValidationError`` as one line: ``loc: msg; loc: msg`` (the first ``limit``
    errors; ``root`` names an error about the whole document). The one copy every CLI, the
    operator's status conditions and the server's 4xx bodies use."""
    errors = exc.errors()[:limit] if limit else exc.errors()
    text = "; ".join(f"{'.'.join(str(x) for x in e['loc']) or root}: {e['msg']}" for e in errors)
    return text or one_line(exc)
