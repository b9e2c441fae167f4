"""The shift-aware scheduler (sec. 6, app. C): throughput model, shared queue, dispatch,
abort and shift-time migration. Engine-agnostic: it emits ``Dispatch``/``Abort`` actions.

    sched = ShiftAwareScheduler(Role.ROLLOUT, ThroughputModel(A, B, C, D))
    sched.add_replicas([ReplicaView("ro0", Role.ROLLOUT, (0,), kv_capacity=65536)])
    sched.submit(SequenceState(seq_id=0, model="policy", prompt_len=128, max_new_tokens=512))
    actions = sched.dispatch()            # [Dispatch(0, "ro0")]
    actions = sched.shift_down(["ro0"])   # alg. 3
    actions = sched.shift_up([new_view])  # alg. 4
"""

from pivot.scheduler.actions import Abort, Action, Dispatch
from pivot.scheduler.queue import WaitingQueue, by_sequence_id, shortest_first
from pivot.scheduler.scheduler import ShiftAwareScheduler
from pivot.scheduler.throughput import (BinaryThroughputModel, FitReport, LatencySample,
                                        ThroughputModel, fit_throughput_model)

__all__ = ["Abort", "Action", "Dispatch", "WaitingQueue", "by_sequence_id", "shortest_first",
           "ShiftAwareScheduler", "BinaryThroughputModel", "FitReport", "LatencySample",
           "ThroughputModel", "fit_throughput_model"]
