"""A replica of several slots (TP, or EP for an MoE) in the slot runtime, for tests (see
``pivot.testing``): one GPS on this host holding a model folder's weights as both models,
two slots of a process per role, and greedy generation through the controller."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Mapping

import torch

from pivot.compat.vllm import remove_cpu_shm
from pivot.gps.actor import GPSActor
from pivot.gps.layout import ModelMeta, plan_storage
from pivot.roles.engine.config import EngineConfig, read_hf_weights
from pivot.roles.engine.requests import GenRequest, SampleSpec
from pivot.roles.engine.slot_context import GeneratorFactory
from pivot.runtime.gps_source import GPSParameterSource
from pivot.runtime.mesh import MeshController
from pivot.ports import free_ports
from pivot.runtime.provision import spawn_host_service
from pivot.types import GENRM, POLICY, Role


@contextlib.contextmanager
def two_slot_mesh(name: str, model_dir: str, configs: Mapping[Role, EngineConfig],
                  ) -> Iterator[tuple[MeshController, dict[str, torch.Tensor]]]:
    """Two slots whose ``configs[role]`` engines serve ``model_dir``'s weights, Read from a
    GPS named ``name`` that holds them as both the policy and the GenRM (so one role can
    be the other's TP=1 reference). A config of ``tensor_parallel_size`` 2 makes that
    role one replica of both slots. Yields the controller and the weights."""
    sd = {k: v.to(torch.float32) for k, v in read_hf_weights(model_dir).items()}
    metas = {m: ModelMeta.from_state_dict(m, sd) for m in (POLICY, GENRM)}
    storage = plan_storage(list(metas.values()), 1, 1 << 30)
    gps = spawn_host_service(name, GPSActor, 0, storage, metas)
    source = GPSParameterSource([gps], metas, storage, (0, 0))
    for m in (POLICY, GENRM):
        source.gps.load(m, sd)
    ports = {r: free_ports(1) if c.tensor_parallel_size > 1 else ()
             for r, c in configs.items()}
    factories = {r: GeneratorFactory(r, c, source, 2, tp_ports=ports[r])
                 for r, c in configs.items()}
    sizes = {r: c.tensor_parallel_size for r, c in configs.items()
             if c.tensor_parallel_size > 1}
    ctl = MeshController.local(2, source, factories, proc_per_role=True,
                               replica_sizes=sizes, call_timeout_s=600.0)
    try:
        yield ctl, sd
    finally:
        ctl.stop()
        source.gps.close()
        gps.close.call_one().get()
        remove_cpu_shm([p for ps in ports.values() for p in ps])   # as ClusterStack.close


def generate(ctl: MeshController, device: int, prompts: list[list[int]], *,
             max_tokens: int = 24, ignore_eos: bool = False,
             abort_first: bool = False) -> dict[int, list[int]]:
    """Greedy tokens of ``prompts`` (sequence ids 0..n-1) on the replica driven from
    ``device``; ``abort_first`` aborts sequence 0 right after submitting."""
    spec = SampleSpec(max_tokens=max_tokens, temperature=0.0, logprobs=False,
                      ignore_eos=ignore_eos)
    reqs = [GenRequest(i, list(p), spec) for i, p in enumerate(prompts)]
    engine = ctl.engine(device)
    assert engine.submit(reqs).get() == [None] * len(reqs)
    out: dict[int, list[int]] = {}
    if abort_first:
        out.update({s: r.tokens for s, r in engine.abort([0]).get().items()})
    deadline = time.monotonic() + 300
    while len(out) < len(reqs) and time.monotonic() < deadline:
        out.update({s: r.tokens for s, r in engine.collect().get().items()})
        time.sleep(0.05)
    assert len(out) == len(reqs), f"unfinished after 300 s: {set(range(len(reqs))) - set(out)}"
    return out
