"""Workarounds of Monarch's internals (PyPI ``torchmonarch`` 0.7.0).

- ``install_fault_hook``: the one owner of ``monarch.actor.unhandled_fault_hook``. Monarch
  calls that module attribute when a supervision event reaches the client, and its default
  exits the client (``sys.exit(1)``, delivered as a KeyboardInterrupt). The mesh controller
  and the generator spawner both need it; assigning it in two places made the last writer
  win, so both register listeners here instead and one dispatcher calls them all.
- ``ensure_client_tmpdir``: the client creates its sockets under ``TMPDIR``, which must exist.
- ``plain_python_logs``: Monarch prefixes every Python log record with the actor's name,
  once per handler.
- ``supervision_error``: the error a call raises once Monarch knows its actor's process
  died (a Rust binding's class, not exported by ``monarch.actor``); a call already in
  flight when the process dies never answers instead (``pivot.runtime.pending``).
- ``shutdown_client``: Monarch's own exit-time shutdown allows itself 1 s; shut down
  earlier with room to finish.

Not a shim but a trap of the same version: import torch before any ``monarch.common._C``
import (``pivot.runtime.provision`` does). ``tests/compat/test_monarch.py`` checks the
private names these rely on. Importing this module does not import Monarch.
"""

from __future__ import annotations

import logging
import os
import threading
import weakref
from collections.abc import Callable, Hashable
from pathlib import Path
from typing import Any

DIST = "torchmonarch"
VERSION = "0.7.0"
WRITTEN_FOR = f"{DIST} {VERSION}"
"""The Monarch every shim below was written for and checked against."""

log = logging.getLogger(__name__)

# -- the unhandled-fault hook ------------------------------------------------------------
_lock = threading.Lock()
_listeners: dict[Hashable, Callable[[], Callable[[Any], None] | None]] = {}
"""key -> a callable returning the listener (None once a weakly held one is gone)."""
_foreign: Callable[[Any], None] | None = None
"""A hook someone else installed before ours (not Monarch's default): composed, run last."""


def default_fault_hook() -> Callable[[Any], None]:
    """Monarch's own hook (``monarch._src.actor.supervision.unhandled_fault_hook``, 0.7.0),
    which exits the client."""
    from monarch._src.actor.supervision import unhandled_fault_hook

    return unhandled_fault_hook


def _dispatch(failure) -> None:
    """The hook installed in ``monarch.actor``: every live listener sees every failure.

    Returning normally tells Monarch the fault is handled (the client stays up). A listener
    that raises is logged and skipped, so one cannot stop the others.
    """
    with _lock:
        live = []
        for key, get in list(_listeners.items()):
            fn = get()
            if fn is None:
                del _listeners[key]
            else:
                live.append(fn)
        foreign = _foreign
    if not live and foreign is None:
        log.warning("Monarch fault with no listener (dropped): %s", failure)
    for fn in live:
        try:
            fn(failure)
        except Exception:  # noqa: BLE001 - a broken listener must not kill the client
            log.exception("fault listener %r raised on %s", fn, failure)
    if foreign is not None:
        foreign(failure)  # its own semantics: raising marks the fault unhandled


def _ref(listener: Callable[[Any], None], weak: bool):
    if not weak:
        return lambda: listener
    if hasattr(listener, "__self__") and hasattr(listener, "__func__"):
        return weakref.WeakMethod(listener)
    return weakref.ref(listener)


def _default_key(listener: Callable[[Any], None], weak: bool) -> Hashable:
    if not weak:
        return listener
    if hasattr(listener, "__self__") and hasattr(listener, "__func__"):
        return ("method", id(listener.__self__), listener.__func__)
    return ("ref", id(listener))


def install_fault_hook(listener: Callable[[Any], None], *, key: Hashable | None = None,
                       weak: bool = False) -> None:
    """Routes Monarch's unhandled supervision failures to ``listener`` (idempotent).

    Installs the one dispatcher as ``monarch.actor.unhandled_fault_hook`` (torchmonarch
    0.7.0 reads that module attribute on every fault) and adds ``listener`` to it. A hook
    found there that is neither Monarch's default nor ours is kept and called after the
    listeners.

    Args:
        listener: called with the ``MeshFailure`` on Monarch's supervision thread.
        key: a listener installed under the same key replaces this one's predecessor
            (default: the listener itself, so installing it twice changes nothing).
        weak: hold the listener weakly (a bound method: its object), so it goes when its
            owner does.
    """
    global _foreign
    import monarch.actor

    with _lock:
        _listeners[_default_key(listener, weak) if key is None else key] = _ref(listener, weak)
        current = monarch.actor.unhandled_fault_hook
        if current is not _dispatch:
            if current is not default_fault_hook():
                _foreign = current
            monarch.actor.unhandled_fault_hook = _dispatch


def remove_fault_listener(key: Hashable) -> None:
    """Drops the listener installed under ``key`` (the listener itself by default)."""
    with _lock:
        _listeners.pop(key, None)


def fault_listeners() -> list[Callable[[Any], None]]:
    """The live listeners, in install order."""
    with _lock:
        return [fn for fn in (get() for get in _listeners.values()) if fn is not None]


# -- the client's process settings --------------------------------------------------------
def ensure_client_tmpdir(default: str | Path) -> Path:
    """Sets ``TMPDIR`` to ``default`` unless it is set, and creates the folder; returns it.

    torchmonarch 0.7.0's client creates its sockets under ``TMPDIR``: on a fresh clone the
    project's folder does not exist yet and the client fails to start.
    """
    os.environ.setdefault("TMPDIR", str(default))
    path = Path(os.environ["TMPDIR"])
    path.mkdir(parents=True, exist_ok=True)
    return path


def plain_python_logs() -> None:
    """Turns off Monarch's actor prefix on Python log records. torchmonarch 0.7.0 adds a
    filter to every logging handler (``actor_mesh._ActorFilter``) that rewrites
    ``record.msg`` to ``"[actor=<root>] " + msg`` unless
    ``monarch._src.actor.config.prefix_python_logs_with_actor`` is false; since the
    rewrite happens once per handler, a client with a console and a run.log handler logs
    "[actor=<root>] [actor=<root>] ...". The launchers format their own lines."""
    from monarch._src.actor import config

    config.prefix_python_logs_with_actor = False


def supervision_error() -> type[Exception]:
    """``SupervisionError``: raised by a call to an actor whose process Monarch's
    supervision reported failed ("The actor ... and all its descendants have failed")."""
    from monarch._rust_bindings.monarch_hyperactor.supervision import SupervisionError

    return SupervisionError


def shutdown_client(host_timeout: float = 10.0, wait_s: float = 60.0) -> bool:
    """Shuts this process's Monarch client down now, with time to finish; returns whether
    a shutdown finished (False if Monarch was never imported, or it did not finish).

    torchmonarch 0.7.0 registers ``shutdown_context(host_timeout=0.3).get(timeout=1.0)``
    as an atexit handler when its client starts. After a full test session (many procs
    spawned, some killed) that call timed out at exit in every run here, and in some runs
    the process then aborted ("FATAL: exception not rethrown", exit 134) after every test
    had passed. Shutting down before exit, with ``host_timeout`` for the host's procs
    and ``wait_s`` in all, leaves the atexit call an already-completed future (Monarch
    returns one to every call after the first). A shutdown that does not finish is
    logged, not raised: the caller is exiting anyway."""
    import sys

    if "monarch._src.actor.actor_mesh" not in sys.modules:
        return False
    from monarch.actor import shutdown_context

    try:
        shutdown_context(host_timeout=host_timeout).get(timeout=wait_s)
    except Exception as e:  # noqa: BLE001 - exiting: report, do not mask the exit status
        log.warning("Monarch's client did not shut down within %.0f s: %s: %s", wait_s,
                    type(e).__name__, e)
        return False
    return True
