"""``pivot.compat.nixl`` against the installed NIXL: versions, the ``nixl._api`` names and
agent methods GPS uses, and one in-process READ between a host agent (progress thread)
and a client agent (none) through the shims."""

import importlib.metadata
import inspect
import subprocess
import sys
import time
import uuid

import numpy as np
import pytest
import torch

from pivot.compat import nixl as nx

RECHECK = ("re-check every shim of pivot/compat/nixl.py (new_agent, add_remote_agent, "
           "HOST_PROGRESS_THREAD / CLIENT_PROGRESS_THREAD, XFER_PENDING / XFER_DONE) and "
           "pivot/gps/nixl.py, and update WRITTEN_FOR")
AGENT_METHODS = {
    "register_memory": ["reg_list"], "deregister_memory": ["dereg_list"],
    "get_agent_metadata": [], "add_remote_agent": ["metadata"],
    "remove_remote_agent": ["agent"], "get_xfer_descs": ["descs", "mem_type"],
    "initialize_xfer": ["operation", "local_descs", "remote_descs", "remote_agent"],
    "transfer": ["handle"], "check_xfer_state": ["handle"], "release_xfer_handle": ["handle"],
}
"""Every agent method ``pivot.gps.nixl`` calls, with the leading parameters it passes."""


def test_installed_nixl_is_the_one_the_shims_were_written_for():
    for dist, want in ((nx.DIST, nx.VERSION), (nx.BACKEND_DIST, nx.BACKEND_VERSION)):
        got = importlib.metadata.version(dist)
        assert got == want, f"{dist} {got} installed, shims written for {nx.WRITTEN_FOR}: " \
                            f"{RECHECK}"


def test_importing_the_compat_module_does_not_import_nixl():
    code = "import sys, pivot.compat.nixl; print('nixl' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "False"


def test_the_private_api_module_offers_the_agent_and_its_config():
    from nixl._api import nixl_agent, nixl_agent_config

    cfg = inspect.signature(nixl_agent_config).parameters
    assert {"backends", "enable_prog_thread"} <= set(cfg), f"nixl_agent_config{cfg}: {RECHECK}"
    assert list(inspect.signature(nixl_agent).parameters)[:2] == ["agent_name", "nixl_conf"]
    for name, lead in AGENT_METHODS.items():
        fn = getattr(nixl_agent, name, None)
        assert callable(fn), f"nixl_agent.{name} is gone: {RECHECK}"
        params = [p for p in inspect.signature(fn).parameters if p != "self"]
        assert params[:len(lead)] == lead, f"nixl_agent.{name}{params}: {RECHECK}"


@pytest.fixture(scope="module")
def agents():
    tag = uuid.uuid4().hex[:6]
    return (nx.new_agent(f"compat-host-{tag}", nx.HOST_PROGRESS_THREAD),
            nx.new_agent(f"compat-client-{tag}", nx.CLIENT_PROGRESS_THREAD))


def test_add_remote_agent_still_returns_bytes_and_the_shim_decodes_it(agents):
    host, client = agents
    meta = host.get_agent_metadata()
    raw = client.add_remote_agent(meta)
    assert isinstance(raw, bytes), f"add_remote_agent now returns {type(raw).__name__}: " \
                                   f"the decode in pivot.compat.nixl.add_remote_agent may go"
    client.remove_remote_agent(raw.decode())
    name = nx.add_remote_agent(client, meta)
    assert name == raw.decode() and isinstance(name, str)
    client.remove_remote_agent(name)


def test_a_read_through_the_shims_completes_with_the_expected_states(agents):
    host, client = agents
    src = torch.arange(256, dtype=torch.float32)
    dst = torch.zeros(256)
    host_reg, client_reg = host.register_memory(src), client.register_memory(dst)
    name = nx.add_remote_agent(client, host.get_agent_metadata())
    try:
        n = src.numel() * src.element_size()
        local = np.array([[dst.data_ptr(), n, 0]], dtype=np.int64)
        remote = np.array([[src.data_ptr(), n, 0]], dtype=np.int64)
        h = client.initialize_xfer("READ", client.get_xfer_descs(local, "DRAM"),
                                   client.get_xfer_descs(remote, "DRAM"), name)
        state = client.transfer(h)
        assert state in (nx.XFER_PENDING, nx.XFER_DONE), f"transfer state {state!r}: {RECHECK}"
        deadline = time.monotonic() + 30
        while state == nx.XFER_PENDING and time.monotonic() < deadline:
            time.sleep(1e-3)
            state = client.check_xfer_state(h)  # the client has no progress thread
        client.release_xfer_handle(h)
        assert state == nx.XFER_DONE, f"READ ended in {state!r}: {RECHECK}"
        assert torch.equal(dst, src)
    finally:
        client.remove_remote_agent(name)
        client.deregister_memory(client_reg)
        host.deregister_memory(host_reg)
