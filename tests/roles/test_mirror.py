"""A TP replica's call mirroring (``pivot.roles.engine.mirror``) over a real gloo group of
two processes, with a recording engine in place of vLLM: the protocol alone."""

import multiprocessing as mp
import os
import traceback

from pivot.ports import free_ports


class RecordingEngine:
    def __init__(self):
        self.calls = []

    def load_weights(self, state):
        self.calls.append(("load_weights", dict(state)))
        return 0.0

    def step(self):
        self.calls.append(("step",))


def _rank(rank: int, port: int, out) -> None:
    try:
        import torch.distributed as dist

        from pivot.errors import StateError
        from pivot.roles.engine.mirror import FollowerLoop, MirroredEngine, replica_group

        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("gloo", rank=rank, world_size=2)
        group = replica_group()
        engine = RecordingEngine()
        if rank == 1:
            loop = FollowerLoop(engine, group)
            loop.reader = lambda ref: ({"w": ref[1]} if ref[1] >= 0
                                       else _raise(OSError(f"no version {ref[1]}")))
            loop.close()            # returns once rank 0's stop arrives
            out.put((1, engine.calls, loop.failed))
            return
        m = MirroredEngine(engine, group)
        m.load_weights_at({"w": 3}, ("policy", 3))
        m.step()
        try:
            m.load_weights_at({"w": -1}, ("policy", -1))
            raised = None
        except StateError as e:
            raised = str(e)
        m.close()
        out.put((0, engine.calls, raised))
    except BaseException:  # noqa: BLE001 - report to the test
        out.put((rank, "error", traceback.format_exc()))


def _raise(e):
    raise e


def test_followers_read_what_rank_0_loads_and_a_failed_follower_load_raises_on_rank_0():
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = free_ports(1)[0]
    procs = [ctx.Process(target=_rank, args=(r, port, out)) for r in (0, 1)]
    for p in procs:
        p.start()
    got = dict((r, (a, b)) for r, a, b in (out.get(timeout=120) for _ in procs))
    for p in procs:
        p.join(timeout=30)
    assert all(a != "error" for a, _ in got.values()), got
    calls0, raised = got[0]
    calls1, failed = got[1]
    # the follower Read the version rank 0 loaded (its reader), in rank 0's call order
    assert calls0 == [("load_weights", {"w": 3}), ("step",), ("load_weights", {"w": -1})]
    assert calls1 == [("load_weights", {"w": 3}), ("step",)]
    # its failed Read reached rank 0, which raised before any step could run
    assert raised is not None and "rank 1: OSError: no version -1" in raised
    assert len(failed) == 1 and "no version -1" in failed[0]
