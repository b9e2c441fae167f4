"""GPS arenas registered with the CUDA driver once per mapping (``pivot.gps.pinned``).

The driver calls are recorded here (no GPU on this machine); ``launchers/gpu_check_gps.py``
runs the real ones. What is checked: a CPU Read or Write never registers; a mapping is
registered once however often it is read; it is unregistered when the transport drops
the mapping (a newer version's arena evicts it, or the host is forgotten)."""

import pytest
import torch

from pivot.errors import StateError
from pivot.gps.layout import ParallelLayout
from pivot.gps.pinned import PinnedArenas, on_device
from pivot.gps.plan import Link
from pivot.gps.transport import MonarchTransport, ShmTransport
from pivot.testing.gps import (SMALL_MODELS, SMALL_POLICY, close_gps, local_gps, random_state,
                               storage_with_k)

DEVICE_HOST = (0, 0)
FULL = ParallelLayout.create(SMALL_POLICY)


class Driver:
    """Records register / unregister calls like the CUDA driver would see them."""

    def __init__(self):
        self.live: dict[int, int] = {}
        self.calls: list[tuple[str, int]] = []

    def register(self, ptr, nbytes):
        assert ptr not in self.live, "registered twice"
        self.live[ptr] = nbytes
        self.calls.append(("register", ptr))

    def unregister(self, ptr):
        assert ptr in self.live, "unregistered an address never registered"
        del self.live[ptr]
        self.calls.append(("unregister", ptr))


@pytest.fixture
def gps():
    drv = Driver()
    shm = ShmTransport(threads=1, pinned=PinnedArenas(drv.register, drv.unregister))
    storage = storage_with_k(list(SMALL_MODELS.values()), 1, 1)
    client, stores = local_gps(SMALL_MODELS, storage, DEVICE_HOST,
                               {Link.LOCAL: shm, Link.REMOTE: MonarchTransport()})
    client.load("policy", random_state(SMALL_POLICY, 0))
    client.load("genrm", random_state(SMALL_MODELS["genrm"], 1))
    yield client, shm, drv
    close_gps(client, stores)


def test_cpu_reads_and_writes_never_register(gps):
    client, shm, drv = gps
    for _ in range(3):
        client.read("policy", (0,), FULL)
    client.write("policy", (0,), FULL, {0: random_state(SMALL_POLICY, 2)})
    client.read("policy", (0,), FULL)
    assert drv.calls == [] and len(shm.pinned) == 0


def test_a_mapping_is_registered_once_and_unregistered_when_dropped(gps):
    client, shm, drv = gps
    pinned = shm.pinned
    registered = 0
    for seed in range(4):   # every Write makes a new version (a new or a recycled arena)
        client.read("policy", (0,), FULL)
        cached = [a for a, _ in shm._arenas[(0, "policy")].values()]
        arena = cached[-1]   # the mapping just read
        # what a Read into a GPU's parameters does first (``ShmTransport._transfer``)
        registered += arena.numel() * pinned.ensure(arena)
        assert pinned.ensure(arena) is False   # once per mapping, however many Reads
        assert arena in pinned
        # two mappings per (host, model) are kept: an evicted one was unregistered
        assert set(drv.live) <= {a.data_ptr() for a in cached}
        client.write("policy", (0,), FULL, {0: random_state(SMALL_POLICY, 10 + seed)})
    # a host recycles one dropped arena as the next Write's staging area, so across four
    # versions the reader maps two arenas and registers each once for the whole run
    assert [c for c, _ in drv.calls] == ["register", "register"]
    client.close()   # the client closes its transports: every registration is undone
    assert drv.live == {} and len(pinned) == 0
    assert pinned.registered_bytes == registered


def test_the_driver_refusing_registration_is_an_error_that_names_the_fix():
    from pivot.gps.pinned import _cuda_register

    if torch.cuda.is_available():
        pytest.skip("a GPU is here: the real call would succeed")
    with pytest.raises((StateError, RuntimeError, AssertionError)):
        _cuda_register(0, 4096)


def test_on_device_finds_the_first_tensor_off_the_cpu():
    assert on_device([torch.zeros(1), torch.zeros(2)]) is None
    assert on_device([torch.zeros(1), torch.empty(1, device="meta")]) == torch.device("meta")


def test_an_evicted_mapping_is_unregistered(gps):
    """A Read that holds an old version keeps its arena from being recycled, so later
    versions land in new arenas and the reader's third mapping evicts its oldest."""
    client, shm, drv = gps
    store = client.hosts[0].store
    held = store.acquire("policy", store.latest("policy"))
    for seed in range(3):
        client.read("policy", (0,), FULL)
        arena = [a for a, _ in shm._arenas[(0, "policy")].values()][-1]
        shm.pinned.ensure(arena)
        client.write("policy", (0,), FULL, {0: random_state(SMALL_POLICY, 20 + seed)})
    store.release("policy", held.version)
    cached = {a.data_ptr() for a, _ in shm._arenas[(0, "policy")].values()}
    assert [c for c, _ in drv.calls].count("unregister") >= 1
    assert set(drv.live) <= cached
