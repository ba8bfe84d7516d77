"""``free_port``: never the same port twice in a row from one process (the kernel would)."""

from __future__ import annotations

import socket

from ttsfleet.devtools.ports import free_port


def test_ports_asked_for_in_a_row_are_all_different_and_free() -> None:
    ports = [free_port() for _ in range(200)]
    assert len(set(ports)) == len(ports)  # the kernel alone repeats ports within a few calls here
    with socket.socket() as s:
        s.bind(("127.0.0.1", ports[-1]))  # and the port is bindable
