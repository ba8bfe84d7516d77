"""The server's event loop and HTTP parser: uvloop and httptools where installed, asyncio and h11 else.

Why: the engine thread shares the server's interpreter with the event loop, and every torch call it
makes lets go of the GIL; getting it back waits for whatever the loop is doing. On an H100 at c=128
(2026-12-06h) the engine thread's launch + other phases took 19 of a 21 ms step with the GPU's work
17.8 ms, and each release waited 0.39 ms on average for the interpreter (the engine's GIL probe;
none of the waits under 50 us: another thread always held it). A profile of the loop at c=64
(2026-12-02-ab run2) spends most of its time in Starlette's streaming response, uvicorn's h11
protocol (a pure-Python HTTP parser and writer) and asyncio's own Python loop. uvloop (libuv, the
loop in C) and httptools (llhttp, the parser in C) are uvicorn's own ``standard`` extras: the same
protocol work with less Python bytecode holding the interpreter per audio chunk written.

Two process switches, for side-by-side runs and for a deployment that must avoid a C extension:

* ``TTSFLEET_EVENT_LOOP``: ``auto`` (default: uvloop when importable, else asyncio's), ``uvloop``
  (an error at start when it is not installed), ``asyncio``;
* ``TTSFLEET_HTTP_PARSER``: ``auto`` (default: httptools when importable, else h11), ``httptools``
  (an error at start when not installed), ``h11``.
"""

from __future__ import annotations

import asyncio
import importlib.util
from collections.abc import Callable, Coroutine
from typing import Any

from ttsfleet.errors import UserError
from ttsfleet.switches import ProcessSwitch, one_of

EVENT_LOOP_ENV = "TTSFLEET_EVENT_LOOP"
EVENT_LOOPS = ("auto", "uvloop", "asyncio")
EVENT_LOOP_SWITCH: ProcessSwitch[str] = ProcessSwitch(EVENT_LOOP_ENV, "auto",
                                                      one_of(EVENT_LOOP_ENV, EVENT_LOOPS, "auto"))
HTTP_PARSER_ENV = "TTSFLEET_HTTP_PARSER"
HTTP_PARSERS = ("auto", "httptools", "h11")
HTTP_PARSER_SWITCH: ProcessSwitch[str] = ProcessSwitch(HTTP_PARSER_ENV, "auto",
                                                       one_of(HTTP_PARSER_ENV, HTTP_PARSERS, "auto"))

#: The C implementation each switch's ``auto`` prefers, by the module that provides it.
_C_MODULES = {EVENT_LOOP_ENV: "uvloop", HTTP_PARSER_ENV: "httptools"}


def _installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def _choose(switch: ProcessSwitch[str], fallback: str) -> str:
    """The switch's choice with ``auto`` resolved: the C module where installed, else ``fallback``;
    the C module named but missing is a one-line error."""
    module, choice = _C_MODULES[switch.env], switch.get()
    if choice == "auto":
        return module if _installed(module) else fallback
    if choice == module and not _installed(module):
        raise UserError(f"{switch.env}={choice}: {module} is not installed (pip install {module})")
    return choice


def event_loop_name() -> str:
    """``uvloop`` or ``asyncio``: the loop :func:`run` starts."""
    return _choose(EVENT_LOOP_SWITCH, "asyncio")


def http_parser() -> str:
    """``httptools`` or ``h11``: uvicorn's ``http`` setting for the server."""
    return _choose(HTTP_PARSER_SWITCH, "h11")


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    if event_loop_name() == "asyncio":
        return None
    import uvloop

    return uvloop.new_event_loop


def run(main: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """``main()`` to completion on the chosen event loop (as :func:`asyncio.run` does)."""
    with asyncio.Runner(loop_factory=_loop_factory()) as runner:
        runner.run(main())
