"""User-facing errors: bad input becomes one readable line and exit code 2, never a traceback.

Raise :class:`UserError` (or a subclass) from any CLI code path for input the user can fix; the
root CLI catches it. HTTP services map their own errors to 4xx JSON bodies instead.
"""

from __future__ import annotations


class UserError(Exception):
    """Input the user can fix: a malformed file, an unknown name, a negative count."""

    exit_code = 2


def one_line(exc: BaseException) -> str:
    """The first line of an exception message, suitable for a terminal."""
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0] if "\n" not in text else " ".join(
        line.strip() for line in text.splitlines() if line.strip())[:500]
