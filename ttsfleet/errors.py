"""User-facing errors: bad input becomes one readable line and exit code 2, never a traceback.

Raise :class:`UserError` (or a subclass) from any CLI code path for input the user can fix; the
root CLI catches it. HTTP services map their own errors to 4xx JSON bodies instead.
"""

from __future__ import annotations


class UserError(Exception):
    """Input the user can fix: a malformed file, an unknown name, a negative count."""

    exit_code = 2


def one_line(exc: BaseException) -> str:
    """An exception message on one line for a terminal: multi-line messages are joined (at most
    500 characters)."""
    lines = [line.strip() for line in (str(exc).strip() or type(exc).__name__).splitlines()]
    lines = [line for line in lines if line]
    return lines[0] if len(lines) == 1 else " ".join(lines)[:500]
