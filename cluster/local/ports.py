"""Free TCP ports for child processes that will bind them a moment later, and whether a
port is taken by a listener now."""

from __future__ import annotations

import itertools
import os
import random
import socket
from collections.abc import Collection
from pathlib import Path


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def listening(port: int, host: str) -> bool:
    """Whether some process accepts connections on host:port now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, port)) == 0


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True


# Where free_port() picks, as FIRST-LAST: several pickers on one host that must not race
# for the same ports (parallel test workers) each get a range of their own.
PORT_RANGE_ENV = "SHARDLIMIT_FREE_PORTS"


def _given_range() -> tuple[int, int] | None:
    """[first, last) from SHARDLIMIT_FREE_PORTS, when it names a usable range."""
    first, _, last = os.environ.get(PORT_RANGE_ENV, "").partition("-")
    if first.isdigit() and last.isdigit() and 1024 <= int(first) < int(last) <= 65_536:
        return int(first), int(last)
    return None


def _free_in(first: int, last: int, host: str, avoid: Collection[int]) -> int | None:
    """A free port of [first, last): a few random tries, then every port from a random one."""
    if last - first > 100:
        for _ in range(100):
            port = random.randrange(first, last)
            if port not in avoid and port_is_free(port, host):
                return port
    start = random.randrange(first, last)
    for port in itertools.chain(range(start, last), range(first, start)):
        if port not in avoid and port_is_free(port, host):
            return port
    return None


def free_port(host: str = "127.0.0.1", avoid: Collection[int] = ()) -> int:
    """A port free now, for a process that will bind it a moment later, and not one of
    `avoid` (ports promised to other processes that have not bound them yet).

    In SHARDLIMIT_FREE_PORTS when it is set (RuntimeError when none there is free);
    else below the kernel's ephemeral range when it can be: a port handed out for
    binding(0) stays free only until the next ephemeral bind or outgoing connection
    takes it (a node's liveness socket once took a router's pre-picked port).
    """
    given = _given_range()
    if given is not None:
        found = _free_in(*given, host, avoid)
        if found is None:
            raise RuntimeError(f"no free port in {PORT_RANGE_ENV}={given[0]}-{given[1]}")
        return found
    low = _ephemeral_low()
    if low > 12_000:
        for _ in range(100):
            port = random.randrange(10_000, low)
            if port not in avoid and port_is_free(port, host):
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        picked: int = sock.getsockname()[1]
        return picked


def free_port_run(count: int, host: str = "127.0.0.1", avoid: Collection[int] = ()) -> int:
    """The first of `count` consecutive free ports, none of them in `avoid` (for
    `shardlimit up --base-port` and `--port` with several routers)."""
    for _ in range(200):
        base = free_port(host, avoid)
        run = range(base, base + count)
        if base + count < 65_536 and all(p not in avoid and port_is_free(p, host) for p in run):
            return base
    raise RuntimeError(f"no {count} consecutive free ports found")
