"""The incremental planner against the former full-scan one (``pivot.testing.
reference_planner``): alg. 1 with back-pointers and array transitions, a what-if load that
adds and retires replicas in place, and candidates evaluated from their counts must give
bit-identical candidate sets, throughputs and plans on random states."""

import random

from hypothesis import given, settings, strategies as st

from pivot.planner import PivotPlanner
from pivot.planner.candidates import candidate_set, construct_candidates
from pivot.planner.evaluate import IncrementalShiftDown, IncrementalShiftUp
from pivot.planner.shift_pairs import ShiftPair
from pivot.scheduler import ShiftAwareScheduler, ThroughputModel
from pivot.scheduler.throughput import BinaryThroughputModel
from pivot.testing.reference_planner import (ReferenceIncrementalShiftDown,
                                             ReferenceIncrementalShiftUp,
                                             ReferencePivotPlanner,
                                             reference_construct_candidates)
from pivot.types import (ReplicaView, Role, RoleLoad, SequenceState, ShiftDown, TrainingLoad,
                         WorkloadSnapshot)

MODELS = [ThroughputModel(A=2e-6, B=0.02, C=4e-4, D=0.005),
          ThroughputModel(A=1.5e-8, B=0.0, C=4.2e-4, D=6.6e-3),
          ThroughputModel(A=8.3e-9, B=0.0, C=2.2e-4, D=5.2e-3)]


def pair(r, phi):
    return ShiftPair((ShiftDown(None, None, (0,)),), tuple((i,) for i in range(r)), phi)


@settings(max_examples=300, deadline=None)
@given(spec=st.lists(st.tuples(st.integers(1, 6), st.sampled_from([0.0, 1.0, 2.5, 7.0])
                               | st.floats(0, 50)), max_size=14),
       K=st.integers(1, 40))
def test_candidate_set_equals_alg1_with_copied_tuples(spec, K):
    """Ties included (few distinct penalties): the same D[k] and the same plan C[k]."""
    pairs = sorted((pair(r, phi) for r, phi in spec), key=lambda p: p.penalty)
    assert construct_candidates(pairs, K) == reference_construct_candidates(pairs, K)
    cs = candidate_set(pairs, K)
    assert cs.counts() == sorted(reference_construct_candidates(pairs, K))


def _load(rng: random.Random, role: Role, n: int, size: int, base: int, kv: int,
          model: ThroughputModel, seqs: int, sid: int) -> tuple[RoleLoad, int]:
    sched = ShiftAwareScheduler(role, model, kv_reserve=rng.choice([0, 2048]))
    sched.add_replicas([ReplicaView(f"{role.value}{i}", role,
                                    tuple(range(base + i * size, base + (i + 1) * size)), kv)
                        for i in range(n)])
    for _ in range(seqs):
        sched.submit(SequenceState(sid, "x", rng.randint(100, 2000), 15_000,
                                   generated_len=rng.choice([0, rng.randint(1, 9000)])))
        sid += 1
    sched.dispatch()
    # some replicas idle, as after their sequences finished
    for v in list(sched.replicas.values()):
        if rng.random() < 0.2:
            for s in list(v.running):
                sched.finish(s)
    load = RoleLoad(role, [v.copy() for v in sched.replicas.values()],
                    [(s.seq_id, s.length) for s in sched.queue], size, kv, 0,
                    tau_shift=rng.choice([1.0, 2.0, 3.4]))
    return load, sid


@st.composite
def states(draw):
    """A random cluster: rollout replicas of ``u`` devices, reward of ``d``, training
    busy, waiting, ready or absent, the other devices idle, loads from empty to queued."""
    rng = random.Random(draw(st.integers(0, 2 ** 31)))
    u, d = draw(st.sampled_from([(1, 4), (1, 1), (2, 8), (4, 1)]))
    host = 8
    hosts = draw(st.integers(2, 10))
    devices = host * hosts
    n_ro = draw(st.integers(0, devices // u // 2))
    n_rm = draw(st.integers(0, (devices - n_ro * u) // d))
    used = n_ro * u + n_rm * d
    rest = list(range(used, devices))
    tr_n = draw(st.sampled_from([0, host, 2 * host]))
    tr_devs = tuple(rest[:tr_n]) if len(rest) >= tr_n else ()
    idle = tuple(x for x in rest if x not in tr_devs)
    m_ro, m_rm = draw(st.sampled_from(MODELS)), draw(st.sampled_from(MODELS))
    ro, sid = _load(rng, Role.ROLLOUT, n_ro, u, 0, rng.choice([60_000, 400_000]), m_ro,
                    draw(st.integers(0, 60 * max(n_ro, 1))), 0)
    rm, _ = _load(rng, Role.REWARD, n_rm, d, n_ro * u, rng.choice([100_000, 1_600_000]),
                  m_rm, draw(st.integers(0, 60 * max(n_rm, 1))), sid)
    ro.max_replicas, rm.max_replicas = devices // u, devices // d
    phase = draw(st.sampled_from(["busy", "waiting", "ready", "none"]))
    tr = TrainingLoad(max(tr_n, host), tr_devs if phase != "none" else (),
                      busy=phase == "busy", batch_ready=phase == "ready")
    if phase == "none":
        idle = tuple(sorted(set(idle) | set(tr_devs)))
    snap = WorkloadSnapshot(0.0, ro, rm, tr, tuple(x // host for x in range(devices)),
                            idle_devices=idle)
    snap.check()
    return snap, m_ro, m_rm


@settings(max_examples=150, deadline=None)
@given(state=states(), H=st.sampled_from([0.01, 60.0, 600.0]), migrate=st.booleans(),
       min_replicas=st.sampled_from([0, 0, 1]), binary=st.booleans())
def test_planner_plans_bit_identical_to_the_full_scan(state, H, migrate, min_replicas,
                                                       binary):
    snap, m_ro, m_rm = state
    if binary:
        m_ro = m_rm = BinaryThroughputModel()
    new = PivotPlanner(m_ro, m_rm, H=H, migrate=migrate, min_replicas=min_replicas)
    ref = ReferencePivotPlanner(m_ro, m_rm, H=H, migrate=migrate,
                                min_replicas=min_replicas)
    assert new.plan(snap) == ref.plan(snap)


@settings(max_examples=100, deadline=None)
@given(state=states(), ks=st.lists(st.integers(0, 6), min_size=1, max_size=6),
       cuts=st.lists(st.integers(0, 3), min_size=1, max_size=6), migrate=st.booleans())
def test_incremental_evaluation_bit_identical_to_the_full_scan(state, ks, cuts, migrate):
    """Every step of the shift-up (more replicas) and shift-down (donor sets that grow or
    restart) evaluation gives the former code's throughput exactly."""
    snap, m_ro, m_rm = state
    up, ref_up = (IncrementalShiftUp(snap.rollout, m_ro, migrate),
                  ReferenceIncrementalShiftUp(snap.rollout, m_ro, migrate))
    k = 0
    for j in ks:
        k += j
        assert up.throughput_with_count(k) == ref_up.throughput_with([(-1,)] * k)
    down, ref_down = (IncrementalShiftDown(snap.reward, m_rm),
                      ReferenceIncrementalShiftDown(snap.reward, m_rm))
    ids = [r.replica_id for r in snap.reward.replicas]
    start = 0
    for c in cuts:
        chosen = ids[start:start + c + 1] if c == 0 else ids[:start + c]
        start += c
        assert down.throughput_without(chosen) == ref_down.throughput_without(chosen)
