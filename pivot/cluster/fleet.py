"""The cluster driver's inference fleet: the shared shift-aware schedulers (sec. 6) over the
vLLM engines in the device slots, and the rollout and reward ports of the RL loop.

Sequence ids: a trajectory t's response is ``2t`` and its judgement ``2t + 1``, so both
roles' sequences never collide in an engine. The generator port keeps its own copies of
the sequence states (tokens kept across aborts); the schedulers keep theirs.

Every operation that calls the slots is written once as steps (``pivot.waits``):
the plain methods block (provisioning, tests), the ``_async`` ones and the two services
await the slots, so the RL loop's event loop never blocks on a slot call. The awaiting
operations hold ``lock`` from their first scheduler change to their last result, so no
two of them interleave (a poll's dispatch never sees a migration's half-applied aborts),
as when every call blocked; the loop's other coroutines run meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from pivot.rewards.genrm import build_genrm_prompt
from pivot.roles.engine.port import GeneratorPort
from pivot.roles.engine.requests import GenRequest, SampleSpec, SeqResult
from pivot.rl.ports import Judgement, Response
from pivot.rl.trajectory import Trajectory
from pivot.waits import Steps, run_async, run_blocking
from pivot.scheduler.actions import Abort, Dispatch
from pivot.scheduler.scheduler import ShiftAwareScheduler
from pivot.shifting.executor import MigrationStats
from pivot.types import GENRM, POLICY, Role, SequenceState

if TYPE_CHECKING:
    from pivot.models.tokenizer import TextCodec
    from pivot.runtime.mesh import EngineHandle

log = logging.getLogger(__name__)
R = TypeVar("R")


class SlotHandle:
    """A ``GeneratorHandle`` over one device slot's active generator context: the blocking
    form of the controller's ``EngineHandle`` (``MeshController.engine``)."""

    def __init__(self, ctl: Any, device: int):
        self.ctl, self.device = ctl, device

    def submit(self, reqs: list[GenRequest]) -> list[str | None]:
        return self.ctl.engine(self.device).submit(reqs).get()

    def abort(self, seq_ids: list[int]) -> dict[int, SeqResult]:
        return self.ctl.engine(self.device).abort(list(seq_ids)).get()

    def collect(self) -> dict[int, SeqResult]:
        return self.ctl.engine(self.device).collect().get()

    def poll(self) -> tuple[dict[int, SeqResult], dict[int, int]]:
        return self.ctl.engine(self.device).poll().get()

    def first_tokens(self, seq_ids: list[int], timeout_s: float = 60.0) -> float:
        return self.ctl.engine(self.device).first_tokens(list(seq_ids), timeout_s).get()

    def started(self) -> EngineHandle:
        """The same calls, each started on the slot without waiting (``GeneratorPort``
        starts one per replica before it waits for any): the typed ``EngineHandle``."""
        return self.ctl.engine(self.device)


class SlotReplicas(Mapping):
    """Replica id -> handle, read live from the device map (replicas come and go)."""

    def __init__(self, ctl: Any):
        self.ctl = ctl

    def _live(self) -> dict[str, tuple[int, ...]]:
        dm = self.ctl.device_map
        return {rid: devs for role in (Role.ROLLOUT, Role.REWARD)
                for rid, devs in dm.replicas(role).items()}

    def __getitem__(self, rid: str) -> SlotHandle:
        return SlotHandle(self.ctl, self._live()[rid][0])

    def __iter__(self) -> Iterator[str]:
        return iter(self._live())

    def __len__(self) -> int:
        return len(self._live())


class Fleet:
    """Schedulers + generator port for both inference roles; the executor's ReplicaPort.

    Args:
        ctl: the mesh controller.
        schedulers: role -> shift-aware scheduler.
        codecs: model -> its ``TextCodec`` (policy and GenRM have their own tokenizers:
            a response is decoded as text and the GenRM's prompt re-encoded from it).
        rollout_spec / judge_spec: sampling of responses and judgements.
        sample_seed: base of per-sequence sampling seeds (deterministic sampling).
        max_retries: how often a sequence whose engine step failed goes back into its
            role's queue, resuming from the tokens it had; after that it is kept as it
            stands (rewarded as written, the failure logged).
    """

    def __init__(self, ctl: Any, schedulers: Mapping[Role, ShiftAwareScheduler],
                 codecs: Mapping[str, TextCodec], rollout_spec: SampleSpec,
                 judge_spec: SampleSpec, sample_seed: int, max_retries: int = 2):
        self.ctl, self.schedulers = ctl, schedulers
        self.codecs = dict(codecs)
        self.specs = {POLICY: rollout_spec, GENRM: judge_spec}
        self.seed = sample_seed
        self.port = GeneratorPort(SlotReplicas(ctl), {}, spec_for=self._spec,
                                  measure_reprefill=False)
        self.trajs: dict[int, Trajectory] = {}
        self.responses: list[Response] = []
        self.judgements: list[Judgement] = []
        self.migration = MigrationStats()
        self.lengths_fed = 0
        self.max_retries = max_retries
        self.retries: dict[int, int] = {}
        self.retried = 0
        self.lock = asyncio.Lock()
        self.on_slot_error: Callable[[BaseException], Awaitable[bool]] | None = None
        """Asked, under ``lock``, when a poll, dispatch or refresh fails: whether a slot
        died (and was handled), so the operation may run again without it
        (``pivot.cluster.faults.SlotFaults.after_error``). None: the failure raises."""

    def _spec(self, seq: SequenceState) -> SampleSpec:
        import dataclasses
        return dataclasses.replace(self.specs[seq.model], seed=self.seed * 1_000_003 + seq.seq_id)

    # ---- ReplicaPort (the executor applies migrations through this) ---------------
    def apply(self, actions: Sequence[object]) -> MigrationStats:
        return run_blocking(self.apply_steps(actions))

    def apply_steps(self, actions: Sequence[object], stats: MigrationStats | None = None
                    ) -> Steps[MigrationStats]:
        st = MigrationStats() if stats is None else stats
        try:
            yield from self.port.apply_steps(actions, st)
        finally:   # what a failed application did still counts
            self.migration.add(st)
        return st

    # ---- blocking and awaiting forms of the steps below ----------------------------
    def submit(self, role: Role, trajs: Sequence[Trajectory]) -> None:
        self.register(role, trajs)
        run_blocking(self.dispatch_steps())

    def dispatch(self) -> None:
        run_blocking(self.dispatch_steps())

    def poll(self) -> None:
        run_blocking(self.poll_steps())

    def refresh_rollout(self) -> float:
        return run_blocking(self.refresh_rollout_steps())

    def reload_policy(self, devices: Sequence[int]) -> None:
        run_blocking(self.reload_policy_steps(devices))

    async def submit_async(self, role: Role, trajs: Sequence[Trajectory]) -> None:
        """Queues at once (the sequences are in the scheduler before the caller can be
        suspended: no tick sees them in nobody's hands), then dispatches under the lock.
        Queueing commutes with any operation in flight: it only adds waiting sequences."""
        self.register(role, trajs)
        await self._guarded(self.dispatch_steps)

    async def poll_async(self) -> None:
        await self._guarded(self.poll_steps)

    async def refresh_rollout_async(self) -> float:
        return await self._guarded(self.refresh_rollout_steps)

    async def _guarded(self, steps_of: Callable[[], Steps[R]]) -> R:
        """Runs the steps under ``lock``; if they fail because a slot died (``on_slot_error``
        says so and has handled it), runs them once more. Each of these operations may
        run again after a partial failure: results read before the failure are kept
        (``GeneratorPort.finished``, the sequences' recorded tokens), and a replica whose
        call failed is gone from the device map, the schedulers and the port."""
        async with self.lock:
            try:
                return await run_async(steps_of())
            except Exception as e:  # noqa: BLE001 - only a slot's death is handled
                if self.on_slot_error is None or not await self.on_slot_error(e):
                    raise
            return await run_async(steps_of())

    async def migrate_async(self, actions_of: Callable[[], Sequence[object]]
                            ) -> MigrationStats:
        """The executor's migration (``ReplicaPort.migrate_async``): the scheduler's
        call and the application of its actions, as one operation."""
        async with self.lock:
            actions = actions_of()
            stats = MigrationStats()
            try:
                await run_async(self.apply_steps(actions, stats))
            except Exception as e:  # noqa: BLE001 - only a slot's death is handled
                moved = self.reconcile(actions)
                if self.on_slot_error is None or not await self.on_slot_error(e):
                    raise
                log.warning("a migration met a dead slot after %d aborts and %d dispatches; "
                            "%d of its sequences stayed where their engines held them or "
                            "went back to their queues", stats.aborted, stats.dispatched,
                            moved)
                await run_async(self.dispatch_steps())
            return stats

    def reconcile(self, actions: Sequence[object]) -> int:
        """After a migration failed partway (alg. 3 / 4 placed every sequence before its
        first action ran), the schedulers are told where each of its sequences really is,
        as the port recorded: still on the replica whose Abort never ran, on the replica
        whose Dispatch did, or, aborted and not dispatched, in the queue (resuming from
        the tokens the abort returned). Call it before the dead slot's replicas are lost
        (``lose_replica`` then requeues what they held). Returns how many moved."""
        moved = 0
        for sid in dict.fromkeys(a.seq_id for a in actions if isinstance(a, (Abort, Dispatch))):
            sched = self.schedulers[Role.ROLLOUT if sid % 2 == 0 else Role.REWARD]
            seq, mine = sched.seqs.get(sid), self.port.sequences.get(sid)
            if seq is None or mine is None:
                continue   # finished
            held = mine.replica_id if mine.replica_id in sched.replicas else None
            if held == seq.replica_id:
                continue
            if held is None:
                sched.abort(seq.replica_id, sid)   # the scheduler's record only
            else:
                sched.restore(sid, held)
            moved += 1
        return moved

    # ---- submission ----------------------------------------------------------------
    def register(self, role: Role, trajs: Sequence[Trajectory]) -> None:
        """Puts the trajectories' sequences (responses, or judgements of their responses)
        into the role's waiting queue and the port's sequence table."""
        sched = self.schedulers[role]
        for t in trajs:
            self.trajs[t.traj_id] = t
            if role is Role.ROLLOUT:
                sid, model, prompt = 2 * t.traj_id, POLICY, list(t.prompt_tokens)
            else:
                sid, model = 2 * t.traj_id + 1, GENRM
                prompt = self.codecs[GENRM].encode(
                    build_genrm_prompt(t.question, t.response_text or ""))
            cap = self.specs[model].max_tokens
            self.port.sequences[sid] = SequenceState(sid, model, len(prompt), cap,
                                                     prompt_tokens=prompt)
            sched.submit(SequenceState(sid, model, len(prompt), cap))

    def dispatch_steps(self) -> Steps[None]:
        for role in (Role.ROLLOUT, Role.REWARD):
            acts = self.schedulers[role].dispatch()
            if acts:
                yield from self.apply_steps(acts)

    # ---- collection ----------------------------------------------------------------
    def poll_steps(self) -> Steps[None]:
        """Collects finished sequences from every replica, frees their scheduler slots,
        dispatches what waits, and queues the results for the two ports."""
        done = yield from self.port.collect_steps()
        for sid, res in done.items():
            role = Role.ROLLOUT if sid % 2 == 0 else Role.REWARD
            sched = self.schedulers[role]
            s = sched.seqs.get(sid)
            if s is not None and s.replica_id is not None:
                sched.finish(sid)
            elif s is not None:   # finished just before an abort re-queued it
                sched.queue.remove(sid)
                del sched.seqs[sid]
            if res.finish_reason == "error" and self.requeue_failed(role, res):
                continue
            seq = self.port.sequences.pop(sid)
            self.port.logprobs.pop(sid, None)
            self.retries.pop(sid, None)
            t = self.trajs[sid // 2]
            processed = seq.prompt_len + len(res.tokens)
            if role is Role.ROLLOUT:
                self.responses.append(Response(t.traj_id, list(res.tokens), list(res.logprobs),
                                               self.codecs[POLICY].decode(res.tokens),
                                               res.finish_reason,
                                               processed))
            else:
                self.trajs.pop(t.traj_id, None)
                self.judgements.append(Judgement(
                    t.traj_id, self.codecs[GENRM].decode(res.tokens), processed,
                    len(res.tokens)))
        self.feed_lengths(self.port.lengths)
        yield from self.dispatch_steps()

    def will_retry(self, res: SeqResult) -> bool:
        """Whether a collected result is a failure the fleet queues again (not final)."""
        return (res.finish_reason == "error"
                and self.retries.get(res.seq_id, 0) < self.max_retries)

    def requeue_failed(self, role: Role, res: SeqResult) -> bool:
        """Puts a sequence whose engine step failed back into ``role``'s queue, resuming
        from the tokens it had (as a migrated sequence does, sec. 6.2), unless it failed
        ``max_retries`` times already. Returns whether it was queued again."""
        sid = res.seq_id
        tries = self.retries.get(sid, 0)
        if not self.will_retry(res):
            log.error("sequence %d failed %d times; kept with its %d tokens: %s", sid,
                      tries + 1, len(res.tokens), res.error)
            return False
        self.retries[sid] = tries + 1
        self.retried += 1
        seq = self.port.sequences[sid]
        seq.generated_tokens, seq.generated_len = list(res.tokens), len(res.tokens)
        self.port.logprobs[sid] = list(res.logprobs)
        seq.replica_id = None
        log.warning("sequence %d failed (%s); queued again from its %d tokens (retry %d "
                    "of %d)", sid, res.error, len(res.tokens), tries + 1, self.max_retries)
        self.schedulers[role].submit(SequenceState(
            sid, seq.model, seq.prompt_len, seq.max_new_tokens, generated_len=len(res.tokens)))
        return True

    def feed_lengths(self, lengths: Mapping[str, Mapping[int, int]]) -> int:
        """Engine progress back to the schedulers (``update_lengths``): the monitor and
        the planner see real N_tok, not the lengths of dispatch time (sec. 6.1, 7.1).
        Sequences the scheduler moved or finished since the engine reported are skipped.
        Returns how many lengths were fed."""
        n = 0
        for rid, lens in lengths.items():
            for sched in self.schedulers.values():
                view = sched.replicas.get(rid)
                if view is None:
                    continue
                mine = {s: max(n, sched.seqs[s].prompt_len) for s, n in lens.items()
                        if s in view.running and s in sched.seqs}
                if mine:
                    sched.update_lengths(rid, mine)
                    n += len(mine)
        self.lengths_fed += n
        return n

    def refresh_rollout_steps(self) -> Steps[float]:
        """Every rollout replica Reads the new policy: its sequences are aborted (tokens
        kept), weights loaded, and the queue dispatched again. Returns seconds."""
        import time
        t0 = time.perf_counter()
        sched = self.schedulers[Role.ROLLOUT]
        replicas = self.ctl.device_map.replicas(Role.ROLLOUT)
        # a replica whose shift up is active in the device map but not yet handed to the
        # scheduler (the executor's migrate-up comes after) holds no sequence: it is only
        # refreshed (a publish during that window crashed the run on an unknown replica)
        acts = [a for rid in replicas if rid in sched.replicas for a in sched.abort(rid)]
        if acts:
            yield from self.apply_steps(acts)   # one round over all replicas
        yield from self.reload_policy_steps([d for devs in replicas.values() for d in devs])
        yield from self.dispatch_steps()
        return time.perf_counter() - t0

    def reload_policy_steps(self, devices: Sequence[int]) -> Steps[None]:
        """The rollout slots on ``devices`` Read the newest policy from GPS, all at once."""
        if not devices:
            return
        out = yield {d: self.ctl.engine(d).refresh() for d in devices}
        for r in out.values():
            if isinstance(r, BaseException):
                raise r

    def pending(self) -> int:
        return sum(s.num_seqs for s in self.schedulers.values())


class RolloutService:
    """The loop's RolloutPort over the fleet."""

    def __init__(self, fleet: Fleet):
        self.fleet = fleet

    async def submit(self, trajs: Sequence[Trajectory]) -> None:
        await self.fleet.submit_async(Role.ROLLOUT, trajs)

    async def poll(self) -> list[Response]:
        await self.fleet.poll_async()
        out, self.fleet.responses = self.fleet.responses, []
        return out


class RewardService:
    """The loop's RewardPort: GenRM judgements through the same fleet."""

    def __init__(self, fleet: Fleet):
        self.fleet = fleet

    async def submit(self, trajs: Sequence[Trajectory]) -> None:
        await self.fleet.submit_async(Role.REWARD, trajs)

    def poll(self) -> list[Judgement]:
        out, self.fleet.judgements = self.fleet.judgements, []
        return out
