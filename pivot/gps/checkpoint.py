"""Every GPS host loads its own shards of a HF checkpoint folder (sec. 5.1).

On a cluster the controller does not read a model and push it to the hosts: each GPS host
reads only the row ranges it holds (:func:`pivot.gps.recovery.host_shards`, by safetensors
slices, :class:`pivot.safetensors_rows.SafetensorsRows`) from a folder every host sees (a
shared file system; here one machine). The load is one commit across the hosts like a
Write (sec. 5.1): stage on every host, each fills itself, prepare, install, publish; a
failure before publishing discards it everywhere.
"""

from __future__ import annotations

import concurrent.futures
import time
from pathlib import Path
from typing import TYPE_CHECKING

from pivot.errors import ConfigError
from pivot.gps.layout import ModelMeta, ParamMeta
from pivot.gps.recovery import host_shards
from pivot.safetensors_rows import SafetensorsRows, checkpoint_files

if TYPE_CHECKING:

    from pivot.gps.client import GlobalParameterStorage
    from pivot.gps.storage import HostStore

_ST_DTYPES = {"F32": "float32", "F16": "float16", "BF16": "bfloat16", "F64": "float64",
              "I64": "int64", "I32": "int32", "U8": "uint8", "I8": "int8"}


def checkpoint_meta(name: str, folder: str | Path) -> ModelMeta:
    """The parameters (HF names, shapes, dtypes) of the checkpoint in ``folder``, read from
    the safetensors headers only."""
    from safetensors import safe_open

    params = []
    for f in checkpoint_files(folder):
        with safe_open(str(f), framework="pt", device="cpu") as h:
            for k in h.keys():
                sl = h.get_slice(k)
                dt = _ST_DTYPES.get(sl.get_dtype())
                if dt is None:
                    raise ConfigError(f"{f}: tensor {k} has dtype {sl.get_dtype()}, which GPS "
                                      f"does not store; expected one of {sorted(_ST_DTYPES)}")
                params.append(ParamMeta(k, tuple(sl.get_shape()), dt))
    return ModelMeta(name, tuple(params))


def fill_host(store: HostStore, model: str, version: int, folder: str | Path) -> int:
    """Copies this host's shards of ``model`` from ``folder`` into its staged ``version``;
    returns the bytes read (only this host's rows)."""
    reader = SafetensorsRows(folder)
    meta = store.models[model]
    want = {p.name: p for p in meta.params}
    for name, p in want.items():
        try:
            shape = reader.shape(name)
        except KeyError:
            raise ConfigError(f"{folder}: no tensor {name} of model {model!r}; the "
                              f"checkpoint does not match the GPS model") from None
        if tuple(shape) != p.shape:
            raise ConfigError(f"{folder}: {name} is {tuple(shape)}, GPS model {model!r} "
                              f"expects {p.shape}; load the checkpoint it was planned for")
    items = [(s.param, s.shard, (slice(None),), reader.rows(s.param, s.r0, s.r1))
             for s in host_shards(store.storage, meta, store.host)]
    store.put(model, version, items)
    return reader.bytes_read


def load_checkpoint(gps: GlobalParameterStorage, model: str, folder: str | Path
                    ) -> tuple[int, dict[int, int], float]:
    """Installs ``folder`` as the next version of ``model``, every host reading its own
    shards in parallel, as one commit across the hosts (the GenRM: only as its first
    version, which the hosts enforce).

    Returns:
        (version, bytes each host read, seconds).
    """
    folder = str(Path(folder).resolve())
    meta = checkpoint_meta(model, folder)
    if model not in gps.models:
        raise ConfigError(f"GPS holds no model {model!r}")
    if meta != gps.models[model]:
        raise ConfigError(f"{folder}: its tensors differ from GPS model {model!r} (names, "
                          f"shapes or dtypes); plan GPS from checkpoint_meta of this folder")
    n = len(gps.hosts)
    t0 = time.perf_counter()
    with gps.lock:
        latest = [gps.hosts[h].latest(model) for h in range(n)]
        old = max((v for v in latest if v is not None), default=None)
        version = 0 if old is None else old + 1
        staged: list[int] = []
        try:
            for h in range(n):
                gps.hosts[h].begin_write(model, version, initial=True,
                                         holder=gps.holder, ttl_s=gps.lease.ttl_s,
                                         published=old)
                staged.append(h)
            with concurrent.futures.ThreadPoolExecutor(n) as pool:
                futs = {h: pool.submit(gps.hosts[h].load_shards, model, version, folder)
                        for h in range(n)}
                read = {h: f.result() for h, f in futs.items()}
            for h in range(n):
                gps.hosts[h].prepare(model, version, [])
            for h in range(n):
                gps.hosts[h].install(model, version)
        except BaseException:
            gps._discard(model, version, staged)
            raise
        gps._publish(model, version)
    return version, read, time.perf_counter() - t0
