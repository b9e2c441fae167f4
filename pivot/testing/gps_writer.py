"""A GPS writer in a process of its own, to be killed mid-Write (the Write lease's tests, sec. 5.1).

``GPSWriter`` is a Monarch actor holding a :class:`GlobalParameterStorage` client over the
GPS host actors it is given; ``start_write`` runs a real Write in the background through
the client's own transports, wrapped in :class:`PauseAfter`, which stops the Write after
``chunks`` (host, device) transfers and touches a marker file: the test then kills the
process with SIGKILL, leaving a half-written version on the hosts.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch  # noqa: F401  (torch before monarch's C extension, docs/stack.md)
from monarch.actor import Actor, endpoint

from pivot.gps.actor import ActorHost
from pivot.gps.client import GlobalParameterStorage
from pivot.gps.layout import ModelMeta, ParallelLayout, StorageLayout
from pivot.gps.lease import WriteLeaseConfig
from pivot.gps.transport import Transport


class PauseAfter(Transport):
    """The inner transport; after ``chunks`` Write transfers, marks ``marker`` and hangs."""

    def __init__(self, inner: Transport, counter: list[int], chunks: int, marker: str) -> None:
        self.inner, self.counter, self.chunks, self.marker = inner, counter, chunks, marker
        self.name = f"pause({inner.name})"

    def read(self, host, manifest, transfers, dst, verify=False):
        self.inner.read(host, manifest, transfers, dst, verify)

    def write(self, host, manifest, transfers, src, verify=False):
        if self.counter[0] >= self.chunks:
            Path(self.marker).write_text(str(self.counter[0]))
            while True:  # the test kills this process here
                time.sleep(1)
        out = self.inner.write(host, manifest, transfers, src, verify)
        self.counter[0] += 1
        return out


class GPSWriter(Actor):
    """A GPS client in its own proc (the trainer's process, standing in)."""

    def __init__(self, gps_actors: Sequence[Any], models: Mapping[str, ModelMeta],
                 storage: StorageLayout, device_host: Sequence[int], ttl_s: float) -> None:
        hosts = [ActorHost(i, a) for i, a in enumerate(gps_actors)]
        self.gps = GlobalParameterStorage(hosts, models, storage, device_host,
                                          lease=WriteLeaseConfig(ttl_s))
        self._thread: threading.Thread | None = None

    @endpoint
    def whoami(self) -> tuple[int, str]:
        """(pid, lease holder id) of this writer."""
        return os.getpid(), self.gps.holder

    @endpoint
    def start_write(self, model: str, devices: list[int], layout: ParallelLayout,
                    states: dict, chunks: int, marker: str) -> None:
        """Starts a Write of ``states`` that stops after ``chunks`` transfers."""
        counter = [0]
        self.gps.transports = {k: PauseAfter(t, counter, chunks, marker)
                               for k, t in self.gps.transports.items()}
        self._thread = threading.Thread(
            target=self.gps.write, args=(model, devices, layout, states), daemon=True)
        self._thread.start()


class GPSUser(Actor):
    """A GPS client on a proc of some host (a trainer or a rollout slot, standing in):
    timed Write and Read through its own transports."""

    def __init__(self, gps_actors: Sequence[Any], models: Mapping[str, ModelMeta],
                 storage: StorageLayout, device_host: Sequence[int]) -> None:
        hosts = [ActorHost(i, a) for i, a in enumerate(gps_actors)]
        self.gps = GlobalParameterStorage(hosts, models, storage, device_host)

    @endpoint
    def where(self) -> str:
        """The host process this proc runs under (``ProcessJob`` names it)."""
        return os.environ.get("HYPERACTOR_PROCESS_NAME", "?")

    @endpoint
    def write_folder(self, model: str, device: int, folder: str) -> tuple[int, int, float, dict]:
        """Writes a HF checkpoint folder's tensors as device ``device`` (TP 1); returns
        (version, bytes, seconds of the Write, transport name per link)."""
        from safetensors.torch import load_file

        from pivot.safetensors_rows import checkpoint_files

        state = {}
        for f in checkpoint_files(folder):
            state.update(load_file(str(f)))
        layout = ParallelLayout.create(self.gps.models[model], dp=1, tp=1, pp=1)
        t0 = time.perf_counter()
        v = self.gps.write(model, (device,), layout, {device: state})
        dt = time.perf_counter() - t0
        return v, sum(t.nbytes for t in state.values()), dt, self._names()

    @endpoint
    def read(self, model: str, device: int) -> tuple[dict, float, dict]:
        """Reads the latest ``model`` as device ``device`` (TP 1); returns (tensors,
        seconds of the Read, transport name per link)."""
        layout = ParallelLayout.create(self.gps.models[model], dp=1, tp=1, pp=1)
        t0 = time.perf_counter()
        out = self.gps.read(model, (device,), layout)[device]
        return out, time.perf_counter() - t0, self._names()

    def _names(self) -> dict:
        return {link.name: t.name for link, t in self.gps.transports.items()}
