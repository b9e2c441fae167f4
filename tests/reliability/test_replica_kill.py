"""A rollout replica's process is killed mid-generation (real Monarch generator actors,
real vLLM engines): its sequences go back to the shared queue with the tokens the driver
recorded, finish on the surviving replica with their prefix intact, and the run goes on
(scheduler.lose_replica, DeviceMap.mark_lost / recover)."""

import os
import signal
import time

import pytest

from pivot.reliability.invariants import ControlState, PrefixLedger, check_state
from pivot.roles.engine.port import GeneratorPort
from pivot.roles.engine.requests import SampleSpec
from pivot.scheduler.scheduler import ShiftAwareScheduler
from pivot.scheduler.throughput import ThroughputModel
from pivot.shifting.device_map import DeviceMap
from pivot.shifting.role_shift import SlotKind
from pivot.types import POLICY, ReplicaView, Role, SequenceState

pytestmark = [pytest.mark.engine, pytest.mark.monarch]

N = 400
SPEC = SampleSpec(max_tokens=N, ignore_eos=True)
PROMPTS = [[1, 5, 6, 7, 8], [1, 9, 10], [1, 40, 41, 42, 43], [1, 70, 71]]


def _collect_until(port, want, timeout_s):
    done, deadline = {}, time.monotonic() + timeout_s
    while set(done) < want and time.monotonic() < deadline:
        done.update(port.collect())
        time.sleep(0.05)
    return done


def test_a_killed_replica_s_sequences_finish_elsewhere_with_their_prefix(engine_config):
    from pivot.testing.generator import ActorHandle, spawn_generators

    actors, procs, failures = spawn_generators(2, engine_config, setup=False)
    try:
        pids = {rid: a.setup.call_one().get()["pid"] for rid, a in actors.items()}
        assert len(set(pids.values())) == 2 and os.getpid() not in pids.values()
        sched = ShiftAwareScheduler(Role.ROLLOUT, ThroughputModel(1e-6, 0.01, 1e-4, 0.001))
        dm = DeviceMap((0, 0))
        for d, rid in enumerate(actors):
            dm.begin_shift_up((d,), Role.ROLLOUT, rid)
            dm.end_shift_up((d,))
            sched.add_replicas([ReplicaView(rid, Role.ROLLOUT, (d,),
                                            engine_config.kv_capacity)])
        seqs = {i: SequenceState(i, POLICY, len(p), N, prompt_tokens=list(p))
                for i, p in enumerate(PROMPTS)}
        for s in seqs.values():
            sched.submit(s)
        handles = {rid: ActorHandle(a) for rid, a in actors.items()}
        port = GeneratorPort(handles, dict(seqs), spec_for=lambda s: SPEC)
        # Everything on slot-0; the driver records progress at an abort-and-resume.
        port.apply(sched.dispatch(["slot-0"]))
        for _ in range(20):
            time.sleep(0.2)
            port.apply(sched.abort("slot-0", "all"))
            port.apply(sched.dispatch(["slot-0"]))
            if min(len(s.generated_tokens or []) for s in seqs.values()) >= 8:
                break
        prefix = {i: list(s.generated_tokens or []) for i, s in seqs.items()}
        assert all(8 <= len(p) < N for p in prefix.values()), prefix
        ledger = PrefixLedger()
        assert ledger.observe(sched.seqs) == []
        time.sleep(0.2)

        t_kill = time.monotonic()
        os.kill(pids["slot-0"], signal.SIGKILL)  # a process this test spawned
        handles.pop("slot-0")
        requeued, dispatches = sched.lose_replica("slot-0")
        dm.mark_lost((0,), "test: slot-0 process killed")
        assert sorted(requeued) == sorted(seqs)
        assert all(a.replica_id == "slot-1" for a in dispatches)
        port.apply(dispatches)
        redispatch_s = time.monotonic() - t_kill
        assert ledger.observe(sched.seqs) == []
        assert check_state(ControlState({Role.ROLLOUT: sched}, dm, 0, 1, 2,
                                        {Role.ROLLOUT: set(seqs)})) == []

        done = _collect_until(port, set(seqs), 90)
        finish_s = time.monotonic() - t_kill
        assert set(done) == set(seqs), f"unfinished: {set(seqs) - set(done)}"
        for i, res in done.items():
            assert len(res.tokens) == N
            assert res.tokens[:len(prefix[i])] == prefix[i], f"sequence {i} lost its prefix"
            # GeneratorPort clears replica_id on the shared state; the scheduler's view
            # still knows where it ran.
            seqs[i].replica_id = next(r for r, v in sched.replicas.items() if i in v.running)
            sched.finish(i)
        assert not sched.seqs and dm.state(0).kind is SlotKind.LOST
        dm.recover((0,))
        assert dm.state(0).kind is SlotKind.IDLE
        print(f"\nreplica kill: re-dispatch {redispatch_s:.3f} s, all finished "
              f"{finish_s:.2f} s after the kill; prefixes {[len(p) for p in prefix.values()]}")
        out = os.environ.get("PIVOT_RELIABILITY_OUT")
        if out:
            import json
            with open(out, "w") as f:
                json.dump({"redispatch_s": redispatch_s, "finish_s": finish_s,
                           "sequences": len(seqs), "lost": 0,
                           "prefix_lens": [len(p) for p in prefix.values()]}, f)
    finally:
        for pm in procs:
            try:
                pm.stop().get()
            except Exception:  # noqa: BLE001 - slot-0's proc is already dead
                pass
