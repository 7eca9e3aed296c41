"""Loopback helpers for process rendezvous on one host."""

from __future__ import annotations

import random
import socket
from pathlib import Path

PORT_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LOWEST_PORT = 10000  # below: well-known and registered services' neighbourhood
ATTEMPTS = 64


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free now, outside the kernel's ephemeral range.

    The port is bound seconds later, by rank 0 once it has imported torch. A port from the ephemeral
    range (what binding port 0 returns) can be handed in between to any socket of this host that
    connects out or binds port 0, gloo's many pairs included, and the rendezvous then fails with
    EADDRINUSE. The kernel never hands out a port below that range by itself.
    """
    low = ephemeral_port_low()
    if low > LOWEST_PORT:
        for _ in range(ATTEMPTS):
            port = random.randrange(LOWEST_PORT, low)
            if _bindable(port):
                return port
    with socket.socket() as s:  # no range to pick from, or all tried were taken: the OS picks
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def ephemeral_port_low() -> int:
    """The lowest port of the kernel's ephemeral range (Linux's default 32768 where it cannot be read)."""
    try:
        return int(PORT_RANGE_FILE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True
