"""``pivot.compat.monarch`` against the installed Monarch: the version, the private names
its shims rely on, the one fault hook (composition, idempotence, weak listeners), and a
real supervision event reaching every listener."""

import gc
import importlib.metadata
import inspect
import logging
import os
import signal
import subprocess
import sys
import time

import pytest

from pivot.compat import monarch as mc

RECHECK = ("re-check every shim of pivot/compat/monarch.py (install_fault_hook and "
           "default_fault_hook, ensure_client_tmpdir, plain_python_logs) and update "
           "WRITTEN_FOR")


@pytest.fixture
def isolated_hook(monkeypatch):
    """Fresh listeners for one test; Monarch's hook is put back afterwards, except that
    Monarch's default (which exits the client) is never reinstalled: the dispatcher stays."""
    import monarch.actor

    before = monarch.actor.unhandled_fault_hook
    monkeypatch.setattr(mc, "_listeners", {})
    monkeypatch.setattr(mc, "_foreign", None)
    yield monarch.actor
    if before is not mc.default_fault_hook():
        monarch.actor.unhandled_fault_hook = before
    else:
        monarch.actor.unhandled_fault_hook = mc._dispatch


def test_installed_monarch_is_the_one_the_shims_were_written_for():
    got = importlib.metadata.version(mc.DIST)
    assert got == mc.VERSION, f"{mc.DIST} {got} installed, shims written for " \
                              f"{mc.WRITTEN_FOR}: {RECHECK}"


def test_importing_the_compat_module_does_not_import_monarch():
    code = "import sys, pivot.compat.monarch; print('monarch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "False"


def test_monarch_still_reads_the_hook_from_monarch_actor_and_its_default_exits():
    import monarch.actor
    from monarch._src.actor.actor_mesh import RootClientActor

    assert hasattr(monarch.actor, "unhandled_fault_hook"), f"no unhandled_fault_hook: {RECHECK}"
    src = inspect.getsource(RootClientActor.__supervise__)
    assert "from monarch.actor import unhandled_fault_hook" in src, \
        "Monarch no longer looks the hook up on monarch.actor at fault time: assigning it " \
        "does nothing; re-check install_fault_hook"
    default = mc.default_fault_hook()
    assert list(inspect.signature(default).parameters) == ["failure"]
    assert "sys.exit" in inspect.getsource(default), "the default hook no longer exits: " \
                                                     "re-check install_fault_hook"


def test_every_listener_sees_each_failure_once(isolated_hook):
    seen_a, seen_b = [], []

    def a(f):
        seen_a.append(f)

    mc.install_fault_hook(a)
    mc.install_fault_hook(a)  # idempotent
    mc.install_fault_hook(seen_b.append, key="b")
    mc.install_fault_hook(lambda f: seen_b.append(("new", f)), key="b")  # replaces "b"
    assert isolated_hook.unhandled_fault_hook is mc._dispatch
    isolated_hook.unhandled_fault_hook("boom")
    assert seen_a == ["boom"] and seen_b == [("new", "boom")]
    mc.remove_fault_listener(a)
    assert len(mc.fault_listeners()) == 1


def test_a_weak_listener_goes_with_its_owner_and_a_raising_one_stops_no_other(isolated_hook):
    class Owner:
        def __init__(self):
            self.seen = []

        def on_fault(self, f):
            self.seen.append(f)

    def broken(f):
        raise RuntimeError("listener bug")

    keep, gone = Owner(), Owner()
    mc.install_fault_hook(broken)
    mc.install_fault_hook(gone.on_fault, weak=True)
    mc.install_fault_hook(keep.on_fault, weak=True)
    del gone
    gc.collect()
    isolated_hook.unhandled_fault_hook("boom")  # returns: the fault counts as handled
    assert keep.seen == ["boom"]
    assert mc.fault_listeners() == [broken, keep.on_fault]


def test_a_foreign_hook_is_composed_not_dropped(isolated_hook):
    seen = []
    isolated_hook.unhandled_fault_hook = lambda f: seen.append(("foreign", f))
    mc.install_fault_hook(lambda f: seen.append(("ours", f)), key="ours")
    isolated_hook.unhandled_fault_hook("boom")
    assert seen == [("ours", "boom"), ("foreign", "boom")]


def test_ensure_client_tmpdir_creates_the_folder_and_keeps_a_set_tmpdir(monkeypatch, tmp_path):
    monkeypatch.delenv("TMPDIR", raising=False)
    assert mc.ensure_client_tmpdir(tmp_path / "a" / "tmp") == tmp_path / "a" / "tmp"
    assert (tmp_path / "a" / "tmp").is_dir()
    assert mc.ensure_client_tmpdir(tmp_path / "b") == tmp_path / "a" / "tmp"


def test_plain_python_logs_turns_off_the_actor_prefix(monkeypatch):
    from monarch._src.actor import actor_mesh, config

    src = inspect.getsource(actor_mesh._ActorFilter.filter)
    assert "prefix_python_logs_with_actor" in src and "record.msg" in src, \
        "Monarch's actor log filter changed: re-check plain_python_logs"
    monkeypatch.setattr(config, "prefix_python_logs_with_actor", True)
    mc.plain_python_logs()
    assert config.prefix_python_logs_with_actor is False
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "message", None, None)
    assert actor_mesh._ActorFilter().filter(record) and record.msg == "message"


@pytest.mark.monarch
def test_a_dead_proc_reaches_every_listener_through_the_one_hook():
    """The mesh controller and the generator spawner both listen; neither replaces the
    other (they used to assign the hook in turn, last writer winning)."""
    from monarch.actor import Actor, endpoint, this_host

    class Pid(Actor):
        @endpoint
        def pid(self) -> int:
            return os.getpid()

    mesh_seen, generator_seen = [], []
    mc.install_fault_hook(generator_seen.append, key="test.generator")
    mc.install_fault_hook(mesh_seen.append, key="test.mesh")
    try:
        procs = this_host().spawn_procs(per_host={"procs": 1}, name="compat_fault")
        actor = procs.spawn("compat_pid", Pid)
        os.kill(actor.pid.call_one().get(timeout=60), signal.SIGKILL)  # our own child
        deadline = time.monotonic() + 60
        while not (mesh_seen and generator_seen) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert mesh_seen and generator_seen, "no supervision event reached both listeners " \
                                             "within 60 s: re-check install_fault_hook"
    finally:
        mc.remove_fault_listener("test.generator")
        mc.remove_fault_listener("test.mesh")


def test_the_supervision_error_a_call_to_a_dead_actor_raises_is_where_we_read_it():
    err = mc.supervision_error()
    assert err.__name__ == "SupervisionError" and issubclass(err, Exception), RECHECK


def test_shutdown_client_finishes_before_exit_and_leaves_the_atexit_call_nothing_to_do():
    """A client with a spawned proc shuts down through ``shutdown_client``; the process then
    exits 0 with no TimeoutError from Monarch's atexit handler, and a second call (as the
    atexit one is) returns at once."""
    code = """
import os, sys, time
import torch  # before monarch's native modules (pivot.runtime.provision's order)
from monarch.actor import Actor, endpoint, this_host
from pivot.compat import monarch as mc
class Pid(Actor):
    @endpoint
    def pid(self) -> int:
        return os.getpid()
procs = this_host().spawn_procs(per_host={"procs": 1}, name="compat_shutdown")
assert procs.spawn("compat_shutdown_pid", Pid).pid.call_one().get(timeout=60) != os.getpid()
assert mc.shutdown_client(), "the shutdown did not finish"
from monarch.actor import shutdown_context
t = time.monotonic(); shutdown_context(host_timeout=0.3).get(timeout=1.0)
assert time.monotonic() - t < 0.5
print("ok")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=180, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr[-2000:]
    assert "TimeoutError" not in out.stderr, out.stderr[-2000:]


def test_shutdown_client_without_monarch_imported_does_nothing():
    code = ("import sys; from pivot.compat import monarch as mc; "
            "assert not mc.shutdown_client(); assert 'monarch' not in sys.modules")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
