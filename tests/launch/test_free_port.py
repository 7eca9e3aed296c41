"""The rendezvous port of a local launch lies outside the kernel's ephemeral range, so that no socket of
this host that connects out (gloo's pairs, another test's ranks) can be handed it before rank 0 binds it."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from longctx.util import net


def test_the_port_is_free_and_below_the_ephemeral_range() -> None:
    low = net.ephemeral_port_low()
    ports = {net.free_port() for _ in range(20)}
    assert all(net.LOWEST_PORT <= p < low for p in ports), (ports, low)
    assert len(ports) > 1  # picked at random: two launches starting together rarely meet
    with socket.socket() as s:
        s.bind(("127.0.0.1", ports.pop()))


def test_without_a_range_below_the_lowest_port_the_os_picks(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    narrow = tmp_path / "ip_local_port_range"
    narrow.write_text(f"{net.LOWEST_PORT - 1}\t60999\n")
    monkeypatch.setattr(net, "PORT_RANGE_FILE", narrow)
    assert net.ephemeral_port_low() == net.LOWEST_PORT - 1
    assert 0 < net.free_port() < 65536
    monkeypatch.setattr(net, "PORT_RANGE_FILE", tmp_path / "missing")
    assert net.ephemeral_port_low() == 32768
