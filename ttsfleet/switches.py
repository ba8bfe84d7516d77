"""Process-wide switches: one ``TTSFLEET_*`` variable, read once at first use, settable in-process.

Why a type: the model has switches read deep inside a prefill or a decode step (the sampler's top-k
selection, decode attention's split and tile, prompt attention's GQA mode). Each needs the same
things: its variable's name, a default, a parse that turns a bad value into a one-line
``ValueError`` naming the choices, the parsed value cached for the process (the hot path reads it,
and a CUDA graph captured with one value must keep it), a setter for tests and benchmarks that A/B
the choices, and a way back to "whatever the environment says". Written out by hand per switch
those drifted; here they are one small class.

Why a registry: the server checks every switch's variable at start (``serve_config``), so a bad
value is a one-line error before it says it is ready, not a traceback in every request. Each
:class:`ProcessSwitch` registers itself when its module is imported, so the check iterates
:func:`registered` instead of a hand-kept list that a new switch could be missing from (the module
that defines a switch must still be imported before the check: ``serve_config`` imports them, and
``tests/core/test_switches.py`` fails if a ``ProcessSwitch`` in the source tree is left out).

Core module: imports the standard library only, so ``ttsfleet.kernels`` may use it.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")

#: Marks a switch whose value has not been read yet (``None`` could be a parsed value).
_UNSET: object = object()

#: Every switch constructed in this process, by variable name.
_REGISTRY: dict[str, ProcessSwitch] = {}


class ProcessSwitch(Generic[T]):
    """One process-wide switch: ``env`` (the variable), ``default`` (the raw value when it is unset)
    and ``parse`` (raw string -> value; a ``ValueError`` with one line naming the choices for a bad
    one). :meth:`get` reads the environment on first use only and caches the parsed value;
    :meth:`set` replaces it for this process; :meth:`reset` forgets it, so the next :meth:`get`
    reads the environment again.

    Constructing one registers it under ``env`` (a second switch with the same name replaces the
    first: that is a module re-imported, whose new object is the one its code now reads)."""

    __slots__ = ("env", "default", "parse", "_value")

    def __init__(self, env: str, default: str, parse: Callable[[str], T]) -> None:
        self.env = env
        self.default = default
        self.parse = parse
        self._value: T | object = _UNSET
        _REGISTRY[env] = self

    def get(self) -> T:
        """The value for this process: the environment's (else ``default``), parsed at first use.
        Two threads meeting an unread switch both parse the same variable; the result is the same."""
        value = self._value
        if value is _UNSET:
            value = self._value = self.parse(os.environ.get(self.env, self.default))
        return value  # type: ignore[return-value]

    def set(self, value: str) -> None:
        """Parse ``value`` and use it for this process from now on (a bad one: ``ValueError``, and
        the current value stays)."""
        self._value = self.parse(value)

    def reset(self) -> None:
        """Forget the value: the next :meth:`get` reads the environment (or ``default``) again."""
        self._value = _UNSET

    def __repr__(self) -> str:
        shown = "unread" if self._value is _UNSET else repr(self._value)
        return f"ProcessSwitch({self.env}, default={self.default!r}, {shown})"


def one_of(env: str, choices: tuple[str, ...], default: str) -> Callable[[str], str]:
    """The parse of a switch with named choices: the value stripped and lower-cased (blank:
    ``default``), else a ``ValueError`` whose one line names the variable and the choices, the same
    message for every such switch."""

    def parse(value: str) -> str:
        value = value.strip().lower() or default
        if value not in choices:
            raise ValueError(f"{env}={value!r}: expected one of {', '.join(choices)}")
        return value

    return parse


def off_auto_or_count(env: str, most: int, default: str) -> Callable[[str], str | int]:
    """The parse of a switch that is ``off``, ``auto`` or a count ``1 .. most`` (blank: ``default``),
    else a ``ValueError`` whose one line names the variable and the choices."""
    return _word_or_count(env, ("off", "auto"), most, default)


def off_or_count(env: str, most: int, default: str) -> Callable[[str], str | int]:
    """The parse of a switch that is ``off`` or a count ``1 .. most`` (blank: ``default``), else a
    ``ValueError`` whose one line names the variable and the choices."""
    return _word_or_count(env, ("off",), most, default)


def all_or_count(env: str, most: int, default: str) -> Callable[[str], str | int]:
    """The parse of a switch that is ``all`` or a count ``1 .. most`` (blank: ``default``), else a
    ``ValueError`` whose one line names the variable and the choices."""
    return _word_or_count(env, ("all",), most, default)


def _word_or_count(env: str, words: tuple[str, ...], most: int, default: str) -> Callable[[str], str | int]:
    def parse(value: str) -> str | int:
        value = value.strip().lower() or default
        if value in words:
            return value
        n = int(value) if value.isdigit() else 0
        if not 1 <= n <= most:
            raise ValueError(f"{env}={value!r}: expected {', '.join(words)} or a count 1..{most}")
        return n

    return parse


def registered() -> list[ProcessSwitch]:
    """Every switch constructed so far (their modules imported), in variable-name order, so a check
    over them reports the same first error whatever the import order was."""
    return [_REGISTRY[name] for name in sorted(_REGISTRY)]
