"""Workarounds of NIXL's internals (PyPI ``nixl`` 1.5.1 over ``nixl-cu12`` 1.5.1, UCX).

The GPS NIXL path (``pivot.gps.nixl``) makes agents through ``nixl._api`` (the module the
meta package aliases to ``nixl_cu12._api``), decodes what ``add_remote_agent`` returns, and
chooses per side whether UCX runs a progress thread. Each is a function or constant here;
``tests/compat/test_nixl.py`` checks them against the installed NIXL.

Importing this module does not import NIXL.
"""

from __future__ import annotations

DIST = "nixl"
VERSION = "1.5.1"
BACKEND_DIST = "nixl-cu12"
BACKEND_VERSION = "1.5.1"
WRITTEN_FOR = f"{DIST} {VERSION} ({BACKEND_DIST} {BACKEND_VERSION}, UCX)"
"""The NIXL every shim below was written for and checked against (``pip install nixl``
1.5.2 pins nixl-cu12/cu13 1.5.2, which do not exist: the meta package goes in with
``--no-deps``)."""

BACKENDS = ("UCX",)
"""The transfer backends an agent starts (DRAM to DRAM; UCX picks CMA between processes)."""

HOST_PROGRESS_THREAD = True
"""The GPS host side runs UCX's progress thread: the target of one-sided transfers (nixl
1.5.1 / UCX) progresses only through its own thread."""
CLIENT_PROGRESS_THREAD = False
"""The client side runs none: UCX's thread busy-polls a whole core even when idle (1.0
core measured; in a device slot capped at half a core it took most of the slot's quota).
The client progresses by polling its transfers' state instead."""

XFER_PENDING = "PROC"
XFER_DONE = "DONE"
"""Transfer states returned by ``transfer`` / ``check_xfer_state`` (nixl 1.5.1; the third
is "ERR")."""


def new_agent(name: str, progress_thread: bool):
    """A NIXL agent with the UCX backend, made through ``nixl._api`` (nixl 1.5.1 exports
    ``nixl_agent`` and ``nixl_agent_config`` there; ``enable_prog_thread`` is the UCX
    progress thread: ``HOST_PROGRESS_THREAD`` or ``CLIENT_PROGRESS_THREAD``)."""
    from nixl._api import nixl_agent, nixl_agent_config

    return nixl_agent(name, nixl_agent_config(backends=list(BACKENDS),
                                              enable_prog_thread=progress_thread))


def add_remote_agent(agent, metadata: bytes) -> str:
    """Loads a peer's metadata into ``agent``; returns the peer's name as ``str``.

    nixl 1.5.1's ``add_remote_agent`` is annotated ``-> str`` but returns bytes; used
    undecoded as a peer name, notifications never match and transfers hang.
    """
    name = agent.add_remote_agent(metadata)
    return name.decode() if isinstance(name, bytes) else name
