"""The communication plan of Read and Write (paper appendix B.2).

1. Refinement: the GPS layout (row ranges along dim 0) and the target layout ``P`` (TP
   chunks along each parameter's split dim, PP stages) are refined to their common
   granularity. For every parameter, the atomic slices are the non-empty intersections of
   a GPS shard and a TP chunk: 1-D row ranges when TP also splits dim 0, 2-D boxes (rows x
   columns) when TP splits dim 1, the GPS shard itself for a replicated parameter.
2. Demands: one per (atomic slice, receiving device) for Read, one per (atomic slice, GPS
   replica holder) for Write (every holder must receive it; the devices become senders).
3. Greedy balancing: each demand goes to the candidate sender with the least accumulated
   estimated latency after taking it (for Write, whose candidate sets overlap, the plan
   falls back to first-holder in the rare case that is better) (``bytes / link bandwidth +
   per-transfer constant``; node-local PCIe vs remote RDMA). Demands are swept largest
   first; a run of demands with the same size, candidates and receiving host is assigned
   in closed form (water filling over the candidates, then a fix-up of at most a few single
   steps), which is exactly the one-at-a-time greedy up to ties, in a few list operations
   per run instead of per demand (:mod:`pivot.gps.greedy`).
4. Caching: :class:`Planner` memoises plans by the signature ``<M, G, P>``; models, GPS
   layout, device-to-host map and link profile are fixed per planner.
"""

from __future__ import annotations

import enum
import functools
import logging
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np

from pivot.errors import ConfigError
from pivot.gps.greedy import assign as _assign
from pivot.gps.layout import ModelMeta, ParallelLayout, StorageLayout, param_stage

logger = logging.getLogger(__name__)


class Link(enum.IntEnum):
    LOCAL = 0
    """Same host: CPU memory to device over PCIe (here: a shared-memory copy)."""
    REMOTE = 1
    """Another host: over the RDMA fabric (here: NIXL or Monarch)."""


@dataclass(frozen=True, slots=True)
class LinkProfile:
    """Profiled link costs (appendix B.2); defaults are the paper's Hopper figures."""

    local_bw: float = 63e9
    """Bytes/s of a host-local PCIe copy."""
    remote_bw: float = 50e9
    """Bytes/s of a remote RDMA transfer."""
    per_transfer_s: float = 5e-6
    """Constant cost of issuing one transfer."""

    def __post_init__(self) -> None:
        if self.local_bw <= 0 or self.remote_bw <= 0 or self.per_transfer_s < 0:
            raise ConfigError(f"LinkProfile needs bandwidths > 0 and per_transfer_s >= 0, "
                              f"got {self}")

    @classmethod
    def from_profile(cls, profile: Mapping[str, float]) -> "LinkProfile":
        """From a one-off profile, e.g. the JSON ``benchmarks/gps.py`` writes."""
        return cls(**{k: float(v) for k, v in profile.items() if k in cls.__slots__})


@dataclass(slots=True)
class Cells:
    """The atomic slices of one model under one target layout (struct of arrays).

    Row range ``[r0, r1)`` on dim 0; when ``split >= 1`` also ``[c0, c1)`` on dim ``split``;
    ``tp`` is the TP chunk index (-1: every TP rank needs it); ``shard`` the GPS shard of the
    parameter it lies in, ``slot`` that shard's group slot.
    """

    param: np.ndarray
    shard: np.ndarray
    slot: np.ndarray
    r0: np.ndarray
    r1: np.ndarray
    split: np.ndarray
    c0: np.ndarray
    c1: np.ndarray
    tp: np.ndarray
    stage: np.ndarray
    nbytes: np.ndarray

    def __len__(self) -> int:
        return int(self.param.size)


@dataclass(frozen=True, slots=True)
class Transfer:
    """One point-to-point copy of one atomic slice (index tuples are slices)."""

    param: str
    shard: int
    shard_box: tuple[slice, ...]
    """Where the slice lies in the GPS shard."""
    target_box: tuple[slice, ...]
    """Where it lies in the device's TP/PP shard."""
    nbytes: int


@dataclass
class Plan:
    """A Read or Write plan: every demand joins a GPS host and a device rank.

    For Read the host sends and the rank receives; for Write the reverse.
    ``sender_load`` is the accumulated estimated latency per sender (hosts for Read, ranks
    for Write).
    """

    op: str
    model: ModelMeta
    devices: tuple[int, ...]
    layout: ParallelLayout
    storage: StorageLayout
    cells: Cells
    cell: np.ndarray
    rank: np.ndarray
    host: np.ndarray
    link: np.ndarray
    cost: np.ndarray
    sender_load: np.ndarray
    num_candidates: int
    strategy: str = "greedy"
    """How senders were chosen: "greedy", or "first-holder" where that was better."""
    _transfers: dict | None = field(default=None, repr=False)
    _shapes: dict | None = field(default=None, repr=False)

    @property
    def makespan(self) -> float:
        """Estimated time of the slowest sender."""
        return float(self.sender_load.max()) if self.sender_load.size else 0.0

    @property
    def ideal(self) -> float:
        """The even split: total estimated cost over every sender that could take part."""
        return float(self.cost.sum()) / max(self.num_candidates, 1)

    @property
    def nbytes(self) -> int:
        return int(self.cells.nbytes[self.cell].sum())

    def target_shapes(self, rank: int) -> dict[str, tuple[int, ...]]:
        """Shape of each parameter shard device ``rank`` holds under ``P`` (do not modify)."""
        _, stage, t = self.layout.coords(rank)
        if self._shapes is None:
            split = dict(self.layout.split_dims)
            shapes: dict[int, dict[str, tuple[int, ...]]] = {s: {} for s in
                                                             range(self.layout.pp)}
            for p in self.model.params:
                shape = list(p.shape)
                d = split.get(p.name)
                if d is not None:
                    shape[d] //= self.layout.tp
                shapes[param_stage(p, self.model.num_layers, self.layout.pp)][p.name] = \
                    tuple(shape)
            self._shapes = {(s, r): {k: v for k, v in shapes[s].items()
                                     if self.layout.holds(k, r)}
                            for s in shapes for r in range(self.layout.tp)}
        return self._shapes[(stage, t)]

    def transfers(self) -> dict[tuple[int, int], list[Transfer]]:
        """The transfers grouped by (GPS host, device rank), built once."""
        if self._transfers is None:
            self._transfers = _build_transfers(self)
        return self._transfers


def _build_transfers(plan: Plan) -> dict[tuple[int, int], list[Transfer]]:
    c, params = plan.cells, plan.model.params
    tp = plan.layout.tp
    shards = plan.storage.param_shards(plan.model.name)
    out: dict[tuple[int, int], list[Transfer]] = {}
    for i in range(plan.cell.size):
        j = int(plan.cell[i])
        p = params[int(c.param[j])]
        d, t = int(c.split[j]), int(c.tp[j])
        r0, r1 = int(c.r0[j]), int(c.r1[j])
        s0 = shards[p.name].rows[int(c.shard[j])][0]
        sbox = [slice(None)] * len(p.shape)
        tbox = [slice(None)] * len(p.shape)
        sbox[0] = slice(r0 - s0, r1 - s0)
        off = t * (p.shape[0] // tp) if d == 0 else 0
        tbox[0] = slice(r0 - off, r1 - off)
        if d >= 1:
            chunk = p.shape[d] // tp
            sbox[d] = slice(int(c.c0[j]), int(c.c1[j]))
            tbox[d] = slice(int(c.c0[j]) - t * chunk, int(c.c1[j]) - t * chunk)
        key = (int(plan.host[i]), int(plan.rank[i]))
        out.setdefault(key, []).append(
            Transfer(p.name, int(c.shard[j]), tuple(sbox), tuple(tbox), int(c.nbytes[j])))
    return out


@dataclass
class _ModelTables:
    """Per-model arrays that do not depend on ``P``: the GPS shards."""

    meta: ModelMeta
    index: dict[str, int]
    rows: np.ndarray
    row_bytes: np.ndarray
    sh_param: np.ndarray
    sh_idx: np.ndarray
    sh_slot: np.ndarray
    sh_r0: np.ndarray
    sh_r1: np.ndarray
    layer: np.ndarray
    """Decoder layer of each parameter; -1 for those on the first stage, -2 the last."""
    num_layers: int

    def stages(self, pp: int) -> np.ndarray:
        """PP stage of every parameter (as :func:`pivot.gps.layout.param_stage`)."""
        st = np.minimum(self.layer * pp // self.num_layers, pp - 1)
        return np.where(self.layer == -1, 0, np.where(self.layer == -2, pp - 1, st))


class Planner:
    """Plans Read and Write for fixed models, GPS layout, device hosts and links; caches
    plans by ``<M, G, P>`` (appendix B.2, plan caching).

    Args:
        models: the models GPS holds, by name.
        storage: the GPS layout (:func:`pivot.gps.layout.plan_storage`).
        device_host: host index of every device in the pool.
        links: link costs.
    """

    def __init__(self, models: Mapping[str, ModelMeta], storage: StorageLayout,
                 device_host: Sequence[int], links: LinkProfile = LinkProfile()) -> None:
        self.models = dict(models)
        self.storage = storage
        self.device_host = np.asarray(device_host, dtype=np.int64)
        if self.device_host.size and (self.device_host.min() < 0
                                      or self.device_host.max() >= storage.hosts):
            raise ConfigError(f"device_host names hosts outside 0..{storage.hosts - 1}: "
                              f"{sorted(set(device_host))}; give one host index per device")
        self.links = links
        self._tables = {name: self._tables_of(m) for name, m in self.models.items()}
        self._cache: dict[tuple, Plan] = {}

    def _tables_of(self, m: ModelMeta) -> _ModelTables:
        shards = self.storage.param_shards(m.name)
        sp, si, ss, r0, r1 = [], [], [], [], []
        for i, p in enumerate(m.params):
            sh = shards[p.name]
            for j, ((a, b), s) in enumerate(zip(sh.rows, sh.slots)):
                sp.append(i), si.append(j), ss.append(s), r0.append(a), r1.append(b)
        rows = np.array([p.shape[0] for p in m.params], dtype=np.int64)
        row_bytes = np.array([p.nbytes // p.shape[0] for p in m.params], dtype=np.int64)
        a = functools.partial(np.array, dtype=np.int64)
        nl = m.num_layers
        layer = a([p.layer if p.layer is not None else
                   (-2 if param_stage(p, nl, 2) == 1 else -1) for p in m.params])
        return _ModelTables(m, {p.name: i for i, p in enumerate(m.params)}, rows, row_bytes,
                            a(sp), a(si), a(ss), a(r0), a(r1), layer, nl)

    def read(self, model: str, devices: Sequence[int], layout: ParallelLayout) -> Plan:
        return self._plan("read", model, devices, layout)

    def write(self, model: str, devices: Sequence[int], layout: ParallelLayout) -> Plan:
        return self._plan("write", model, devices, layout)

    def _plan(self, op: str, model: str, devices: Sequence[int], layout: ParallelLayout,
              greedy: bool = True) -> Plan:
        key = (op, model, tuple(devices), layout, greedy)
        plan = self._cache.get(key)
        if plan is None:
            plan = self._compute(op, model, key[2], layout, greedy)
            self._cache[key] = plan
        return plan

    def check(self, model: str, devices: Sequence[int], layout: ParallelLayout) -> ModelMeta:
        """Validates ``<M, G, P>``; raises ConfigError naming the problem and the fix."""
        if model not in self.models:
            raise ConfigError(f"GPS holds no model {model!r} (it holds: "
                              f"{', '.join(self.models)}); Write it first or fix the name")
        meta = self.models[model]
        n = self.device_host.size
        if len(devices) != layout.world:
            raise ConfigError(f"{model}: layout DP={layout.dp} x PP={layout.pp} x "
                              f"TP={layout.tp} needs {layout.world} devices, got "
                              f"{len(devices)}; pass exactly that many")
        if len(set(devices)) != len(devices):
            raise ConfigError(f"{model}: devices {list(devices)} repeat a device")
        bad = [d for d in devices if not 0 <= d < n]
        if bad:
            raise ConfigError(f"{model}: devices {bad} do not exist (the pool has {n} "
                              f"devices, 0..{n - 1}); ask for existing devices")
        nl = self._tables[model].num_layers
        if layout.pp > nl:
            raise ConfigError(f"{model}: PP={layout.pp} exceeds its {nl} layers")
        known = {p.name: p for p in meta.params}
        stray = [name for name, _ in layout.owners if name not in known]
        if stray:
            raise ConfigError(f"{model}: layout gives owners to unknown parameters "
                              f"{stray[:3]}; build it with ParallelLayout.create(model, ...)")
        for name, d in layout.split_dims:
            p = known.get(name)
            if p is None:
                raise ConfigError(f"{model}: layout splits unknown parameter {name!r}; build "
                                  f"it with ParallelLayout.create(model, ...)")
            if d is None:
                continue
            if not 0 <= d < len(p.shape):
                raise ConfigError(f"{model}: parameter {name} has {len(p.shape)} dims, "
                                  f"cannot split dim {d}")
            if p.shape[d] % layout.tp:
                raise ConfigError(f"{model}: TP={layout.tp} does not divide dim {d} "
                                  f"(size {p.shape[d]}) of parameter {name}; choose a TP "
                                  f"that divides it or mark it replicated (None)")
        return meta

    def _cells(self, tb: _ModelTables, layout: ParallelLayout) -> Cells:
        split = dict(layout.split_dims)
        dpar = np.array([-1 if split.get(p.name) is None else split[p.name]
                         for p in tb.meta.params], dtype=np.int64)
        stage_p = tb.stages(layout.pp)
        dim_d = np.array([p.shape[d] if d >= 0 else 1 for p, d in zip(tb.meta.params, dpar)],
                         dtype=np.int64)
        tp = layout.tp
        d_sh = dpar[tb.sh_param]
        parts = []
        owner = dict(layout.owners)
        own_p = np.array([owner.get(p.name, -1) for p in tb.meta.params], dtype=np.int64)
        own_sh = own_p[tb.sh_param]
        # Replicated (or TP = 1): the GPS shard is the atomic slice, every TP rank needs it;
        # a parameter one TP rank owns (EP's experts) goes to that rank alone, whole.
        rep = np.flatnonzero(((d_sh < 0) | (tp == 1)) & (own_sh < 0))
        parts.append((rep, np.full(rep.size, -1), tb.sh_r0[rep], tb.sh_r1[rep],
                      np.zeros(rep.size, np.int64), np.zeros(rep.size, np.int64)))
        own = np.flatnonzero(own_sh >= 0)
        parts.append((own, own_sh[own], tb.sh_r0[own], tb.sh_r1[own],
                      np.zeros(own.size, np.int64), np.zeros(own.size, np.int64)))
        if tp > 1:
            t = np.arange(tp)
            col = np.flatnonzero(d_sh >= 1)  # GPS rows x TP columns: 2-D boxes
            s, tt = np.repeat(col, tp), np.tile(t, col.size)
            chunk = dim_d[tb.sh_param[s]] // tp
            parts.append((s, tt, tb.sh_r0[s], tb.sh_r1[s], tt * chunk, (tt + 1) * chunk))
            row = np.flatnonzero(d_sh == 0)  # both cut dim 0: 1-D intervals
            s, tt = np.repeat(row, tp), np.tile(t, row.size)
            chunk = tb.rows[tb.sh_param[s]] // tp
            a = np.maximum(tb.sh_r0[s], tt * chunk)
            b = np.minimum(tb.sh_r1[s], (tt + 1) * chunk)
            keep = b > a
            z = np.zeros(int(keep.sum()), np.int64)
            parts.append((s[keep], tt[keep], a[keep], b[keep], z, z))
        s = np.concatenate([q[0] for q in parts])
        tt, r0, r1, c0, c1 = (np.concatenate([q[i] for q in parts]) for i in range(1, 6))
        param = tb.sh_param[s]
        d = np.where(tt < 0, -1, dpar[param])   # an owned parameter's dpar is -1
        rb = tb.row_bytes[param]
        nbytes = np.where(d >= 1, (r1 - r0) * rb // np.maximum(tp, 1), (r1 - r0) * rb)
        return Cells(param, tb.sh_idx[s], tb.sh_slot[s], r0, r1, d, c0, c1, tt,
                     stage_p[param], nbytes)

    def _compute(self, op: str, model: str, devices: tuple[int, ...], layout: ParallelLayout,
                 greedy: bool) -> Plan:
        meta = self.check(model, devices, layout)
        tb = self._tables[model]
        cells = self._cells(tb, layout)
        dp, pp, tp = layout.dp, layout.pp, layout.tp
        st = self.storage
        dev_host = self.device_host[np.asarray(devices, dtype=np.int64)]
        idx = np.arange(len(cells))
        one = cells.tp >= 0
        strategy = "greedy" if greedy else "first-holder"
        # Receivers (Read) / holders of the slice (Write) on the device side.
        dpi = np.arange(dp)
        r_one = ((dpi[None, :] * pp + cells.stage[one][:, None]) * tp
                 + cells.tp[one][:, None])
        grid = (dpi[:, None] * pp * tp + np.arange(tp)[None, :]).ravel()
        r_all = cells.stage[~one][:, None] * tp + grid[None, :]
        if op == "read":
            cell = np.concatenate([np.repeat(idx[one], dp), np.repeat(idx[~one], dp * tp)])
            rank = np.concatenate([r_one.ravel(), r_all.ravel()])
            cands = [np.arange(st.groups, dtype=np.int64) * st.k + s for s in range(st.k)]
            rh = dev_host[rank]
            slot = cells.slot[cell]
            local_pos = (rh if st.groups == 1 else
                         np.where(rh % st.k == slot, rh // st.k, -1))  # unused when 1 group
            sender, link, cost, load = _assign(
                cells.nbytes[cell], slot, rh, local_pos, cands,
                np.arange(st.hosts), st.hosts, self.links, greedy)
            host = sender
            num_candidates = st.hosts
        elif op == "write":
            g = np.arange(st.groups)
            cell = np.repeat(idx, st.groups)
            host = (g[None, :] * st.k + cells.slot[:, None]).ravel()
            # Candidate sets: the ranks holding a slice, keyed by (stage, tp chunk or all).
            cset_of = cells.stage * (tp + 1) + (cells.tp + 1)
            cands = []
            for key in range(pp * (tp + 1)):
                s, t = divmod(key, tp + 1)
                t -= 1
                cands.append((dpi[:, None] * pp * tp + s * tp + (np.arange(tp)[None, :]
                              if t < 0 else t)).ravel().astype(np.int64))
            args = (cells.nbytes[cell], cset_of[cell], host, host, cands, dev_host,
                    layout.world, self.links)
            sender, link, cost, load = _assign(*args, greedy)
            if greedy:
                # Write's candidate sets overlap (a replicated slice may come from any TP
                # rank), so the greedy bound against first-holder no longer holds: keep the
                # better of the two (first-holder is one vectorised pass).
                alt = _assign(*args, False)
                if alt[3].max() < load.max():
                    sender, link, cost, load = alt
                    strategy = "first-holder"
            rank = sender
            num_candidates = layout.world
        else:
            raise ConfigError(f"unknown GPS operation {op!r}; expected 'read' or 'write'")
        return Plan(op, meta, devices, layout, st, cells, cell, rank, host, link, cost, load,
                    num_candidates, strategy)
