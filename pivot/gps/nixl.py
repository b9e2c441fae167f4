"""The NIXL path of GPS (paper appendix B.2: "the collective is executed through NIXL").

DRAM to DRAM over UCX: the GPS host registers its version arenas with a NIXL agent
(:class:`NixlHostEndpoint`, inside the GPS actor); the caller's :class:`NixlTransport`
registers its own buffers, fetches the host agent's metadata once per arena, and posts one
READ (Read) or WRITE (Write) request per (host, device) pair whose descriptors are the
contiguous byte runs of every slice (a column slice of a row-major shard is one run per
row). The reaches into NIXL (``nixl._api``, the bytes ``add_remote_agent`` returns, the
UCX progress thread, transfer states) are shims of ``pivot.compat.nixl``.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from typing import Sequence

import numpy as np
import torch

from pivot.compat import nixl as nx
from pivot.errors import StateError
from pivot.gps.manifest import Manifest, checksum
from pivot.gps.plan import Transfer
from pivot.gps.transport import Expected, Transport

logger = logging.getLogger(__name__)


class NixlHostEndpoint:
    """The host side: one agent, arenas registered on demand (kept while stored)."""

    def __init__(self, host: int) -> None:
        # the target of one-sided transfers progresses only through its own thread;
        # started on the first remote Read or Write of this host
        self.agent = nx.new_agent(f"gps-h{host}-{os.getpid()}-{uuid.uuid4().hex[:6]}",
                                  nx.HOST_PROGRESS_THREAD)
        self._reg: dict[str, tuple[torch.Tensor, object]] = {}

    def expose(self, path: str, arena: torch.Tensor, live: set[str]) -> tuple[bytes, int]:
        """Registers ``arena`` (once) and drops registrations of arenas no longer ``live``;
        returns the agent metadata and the arena's base address."""
        for p in [p for p in self._reg if p not in live and p != path]:
            _, descs = self._reg.pop(p)
            self.agent.deregister_memory(descs)
        if path not in self._reg:
            self._reg[path] = (arena, self.agent.register_memory(arena))
        return self.agent.get_agent_metadata(), arena.data_ptr()


def byte_runs(shape: Sequence[int], itemsize: int, box: Sequence[slice], j: int
              ) -> tuple[np.ndarray, int]:
    """Byte offsets of the contiguous runs of ``box`` in a C-contiguous tensor of
    ``shape``, cutting at dim ``j`` (every run spans the box along dims >= j)."""
    ranges = [range(*s.indices(n)) for s, n in zip(box, shape)]
    strides = np.cumprod([1, *shape[::-1]])[:-1][::-1] * itemsize
    run = len(ranges[j]) * int(strides[j]) if len(ranges) else itemsize
    offs = np.zeros(1, dtype=np.int64)
    for d in range(j):
        offs = (offs[:, None] + np.asarray(ranges[d], dtype=np.int64)[None, :]
                * int(strides[d])).ravel()
    return offs + ranges[j].start * int(strides[j]), run


def _cut_dim(shape: Sequence[int], box: Sequence[slice]) -> int:
    """The outermost dim from which the box is one run: the last dim it does not span."""
    j = 0
    for d, (s, n) in enumerate(zip(box, shape)):
        if s.indices(n)[:2] != (0, n):
            j = d
    return j


class NixlTransport(Transport):
    """Remote path over NIXL (UCX), DRAM to DRAM; the host side runs in the GPS actor."""

    name = "nixl"

    def __init__(self, poll_s: float = 1e-4, timeout_s: float = 300.0) -> None:
        # No progress thread (it busy-polls a core, pivot.compat.nixl): the client
        # progresses by polling its transfers' state.
        self.agent = nx.new_agent(f"gps-client-{os.getpid()}-{uuid.uuid4().hex[:6]}",
                                  nx.CLIENT_PROGRESS_THREAD)
        self._remote: dict[tuple[int, str], tuple[str, int]] = {}
        self._poll, self._timeout = poll_s, timeout_s
        # One agent per transport, not thread-safe: a write_async of the client racing a
        # Read of the same client crashed (segfault) in the agent without this lock.
        self._lock = threading.RLock()

    def _peer(self, host, manifest: Manifest, staged: bool) -> tuple[str, int]:
        key = (manifest.host, manifest.path)
        hit = self._remote.get(key)
        if hit is None:
            meta, base = host.nixl_expose(manifest.model, manifest.version, staged)
            # The host's metadata now lists its new arena: reload the peer.
            for k in [k for k in self._remote if k[0] == manifest.host]:
                self.agent.remove_remote_agent(self._remote.pop(k)[0])
            name = nx.add_remote_agent(self.agent, meta)  # nixl returns bytes
            hit = self._remote[key] = (name, base)
        return hit

    def forget_host(self, host: int) -> None:
        with self._lock:
            for key in [k for k in self._remote if k[0] == host]:
                self.agent.remove_remote_agent(self._remote.pop(key)[0])

    def _descs(self, manifest: Manifest, base: int, transfers: Sequence[Transfer],
               bufs: dict[str, torch.Tensor]) -> tuple[np.ndarray, np.ndarray]:
        where = {key: (off, shape) for key, off, shape, _ in manifest.entries}
        local, remote = [], []
        for t in transfers:
            off, shape = where[(t.param, t.shard)]
            buf = bufs[t.param]
            if not buf.is_contiguous():
                raise StateError(f"NIXL needs contiguous buffers; {t.param} is not")
            j = max(_cut_dim(shape, t.shard_box), _cut_dim(buf.shape, t.target_box))
            r_off, run = byte_runs(shape, buf.element_size(), t.shard_box, j)
            l_off, run2 = byte_runs(buf.shape, buf.element_size(), t.target_box, j)
            if run * r_off.size != t.nbytes or run2 * l_off.size != t.nbytes:
                raise StateError(
                    f"size mismatch on NIXL transfer of {manifest.model} {t.param} shard "
                    f"{t.shard} with GPS host {manifest.host}: the host's box is "
                    f"{run * r_off.size} bytes, the buffer's {run2 * l_off.size}, the plan "
                    f"expects {t.nbytes}; rebuild the host with this GPS layout and retry")
            if run != run2:  # same bytes, cut differently: not expressible as run pairs
                raise StateError(f"NIXL: {t.param} shard {t.shard} runs of {run} and "
                                 f"{run2} bytes do not pair up; use contiguous buffers")
            n = r_off.size
            remote.append(np.stack([base + off + r_off, np.full(n, run), np.zeros(n, np.int64)],
                                   axis=1))
            local.append(np.stack([buf.data_ptr() + l_off, np.full(n, run),
                                   np.zeros(n, np.int64)], axis=1))
        return np.concatenate(local), np.concatenate(remote)

    def _run(self, op: str, host, manifest: Manifest, transfers: Sequence[Transfer],
             bufs: dict[str, torch.Tensor], staged: bool) -> None:
        if not transfers:
            return
        with self._lock:
            self._run_locked(op, host, manifest, transfers, bufs, staged)

    def _run_locked(self, op: str, host, manifest: Manifest, transfers: Sequence[Transfer],
                    bufs: dict[str, torch.Tensor], staged: bool) -> None:
        name, base = self._peer(host, manifest, staged)
        tensors = list({id(b): b for b in bufs.values()}.values())
        reg = self.agent.register_memory(tensors)
        try:
            loc, rem = self._descs(manifest, base, transfers, bufs)
            h = self.agent.initialize_xfer(op, self.agent.get_xfer_descs(loc, "DRAM"),
                                           self.agent.get_xfer_descs(rem, "DRAM"), name)
            state = self.agent.transfer(h)
            t0 = time.monotonic()
            while state == nx.XFER_PENDING:
                if time.monotonic() - t0 > self._timeout:
                    raise StateError(f"NIXL {op} from GPS host {manifest.host} did not finish "
                                     f"in {self._timeout} s")
                time.sleep(self._poll)
                state = self.agent.check_xfer_state(h)
            self.agent.release_xfer_handle(h)
            if state != nx.XFER_DONE:
                raise StateError(f"NIXL {op} with GPS host {manifest.host} failed ({state})")
        finally:
            self.agent.deregister_memory(reg)

    def read(self, host, manifest, transfers, dst, verify=False):
        self._run("READ", host, manifest, transfers, dst, staged=False)
        if verify:
            sums = host.checksums(manifest.model, manifest.version,
                                  [(t.param, t.shard, t.shard_box) for t in transfers])
            for t, want in zip(transfers, sums):
                got = checksum(dst[t.param][t.target_box])
                if got != want:
                    raise StateError(f"checksum mismatch on NIXL read of {t.param} shard "
                                     f"{t.shard}: received {got}, host has {want}")

    def write(self, host, manifest, transfers, src, verify=False) -> list[Expected]:
        bufs = {k: v if v.is_contiguous() else v.contiguous() for k, v in src.items()}
        self._run("WRITE", host, manifest, transfers, bufs, staged=True)
        if not verify:
            return []
        return [(t.param, t.shard, t.shard_box, checksum(bufs[t.param][t.target_box]))
                for t in transfers]
