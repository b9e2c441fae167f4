"""Free TCP ports of this machine, for rendezvous (torch.distributed, vLLM's
``external_launcher``)."""

from __future__ import annotations

import socket


def free_ports(n: int, host: str = "127.0.0.1") -> tuple[int, ...]:
    """``n`` distinct TCP ports free on ``host`` now. The sockets are held open together
    while they are chosen, so the ports differ; another process may still take one before
    it is used."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind((host, 0))
            socks.append(s)
        return tuple(s.getsockname()[1] for s in socks)
    finally:
        for s in socks:
            s.close()
