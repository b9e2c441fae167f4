"""A slot's two engines asleep and awake (``pivot.roles.engine.sleep``, sec. 5.2): after many
sleep/wake cycles both serve what they served before them (greedy, token for token, and
what transformers computes); every sleep really returns its memory to the OS."""

import pytest

from pivot.errors import ConfigError
from pivot.roles.engine.memory import process_rss
from pivot.roles.engine.requests import GenRequest, SampleSpec
from pivot.roles.engine.sleep import TAGS, CpuStorageMemory, EngineMemory, check_tags
from pivot.shifting.contexts import apply_steps
from pivot.shifting.role_shift import shift_down_steps, shift_up_steps
from pivot.types import Role

pytestmark = pytest.mark.engine

PROMPT = [1, 5, 6]
SPEC = SampleSpec(max_tokens=12, ignore_eos=True)

CYCLES = 12
RSS_TOLERANCE = 0.8
"""A sleep must lower the process's RSS by at least this share of the bytes it released
(the rest of the process, idle step threads included, allocates a little meanwhile)."""


def greedy(ctx, seq_id: int) -> list[int]:
    assert ctx.loop.submit([GenRequest(seq_id, PROMPT, SPEC)]) == [None]
    return ctx.loop.wait([seq_id])[seq_id].tokens


def test_the_cpu_engine_memory_is_an_engine_memory_and_tags_are_checked(slot_pair):
    rollout, _ = slot_pair
    assert isinstance(rollout.loop.engine.memory, CpuStorageMemory)
    assert isinstance(rollout.loop.engine.memory, EngineMemory)
    assert check_tags(["weights"]) == ("weights",)
    with pytest.raises(ConfigError, match="kv_cache"):
        check_tags(["kv"])


def test_both_engines_serve_the_same_after_many_sleep_wake_cycles(
        slot_pair, weights, genrm_weights, hf, hf_genrm):
    rollout, reward = slot_pair
    plan = ((rollout, Role.ROLLOUT, weights[1], hf), (reward, Role.REWARD, genrm_weights[1],
                                                        hf_genrm))
    first: dict[Role, list[int]] = {}
    for c in range(CYCLES):
        for ctx, role, w, ref in plan:
            apply_steps(ctx, shift_up_steps(role), lambda w=w: w)
            got = greedy(ctx, 1000 * (c + 1) + len(first))
            apply_steps(ctx, shift_down_steps(role), lambda: None)
            if c == 0:
                first[role] = got
                assert got == ref.load(w).greedy(PROMPT, 12), f"{role.value}: not transformers'"
            assert got == first[role], f"{role.value}, cycle {c}: {got} != {first[role]}"


def test_each_sleep_returns_the_released_memory_and_each_wake_takes_it_again(
        slot_pair, weights, genrm_weights):
    """RSS after a sleep is lower by at least ``RSS_TOLERANCE`` of the released bytes, on
    every cycle (glibc keeps re-used chunks in its heap: without ``trim_heap`` only the
    first sleep of an engine lowered RSS), and a wake (zero-filled KV) takes it back."""
    rollout, reward = slot_pair
    for c in range(4):
        for ctx, role, w in ((rollout, Role.ROLLOUT, weights[0]),
                             (reward, Role.REWARD, genrm_weights[0])):
            asleep = process_rss()
            apply_steps(ctx, shift_up_steps(role), lambda w=w: w)
            rep = ctx.loop.call(lambda e: e.release())
            released = rep.kv_bytes + rep.weight_bytes
            assert released >= ctx.cfg.kv_capacity * 64, "nothing to measure"  # >= 64 B/token
            drop = rep.rss_before - rep.rss_after
            assert drop >= RSS_TOLERANCE * released, \
                f"{role.value} cycle {c}: RSS fell {drop} B for {released} B released"
            assert rep.rss_before - asleep >= RSS_TOLERANCE * rep.kv_bytes, \
                f"{role.value} cycle {c}: the wake took {rep.rss_before - asleep} B"
            ctx.holds_weights = False
    for ctx in slot_pair:
        assert set(ctx.loop.engine.memory.asleep) == set(TAGS)


class _SleepModeCalls:
    """Records the ``LLMEngine`` calls ``VllmSleepMemory`` makes (the GPU build's API, which
    this CPU-only machine cannot run; its names are checked in tests/compat)."""

    def __init__(self):
        self.calls: list[tuple] = []

    def sleep(self, level: int = 1):
        self.calls.append(("sleep", level))

    def wake_up(self, tags=None):
        self.calls.append(("wake_up", tuple(tags)))

    def reset_prefix_cache(self):
        self.calls.append(("reset_prefix_cache",))


def test_the_gpu_memory_sleeps_at_level_2_and_wakes_weights_before_the_kv_cache():
    from pivot.roles.engine.sleep import VllmSleepMemory, engine_memory

    llm = _SleepModeCalls()
    mem = engine_memory(llm, None, "cuda")
    assert isinstance(mem, VllmSleepMemory) and isinstance(mem, EngineMemory)
    mem.sleep(("kv_cache",))   # the shift's first step: marked, freed with the weights
    assert llm.calls == [] and mem.asleep == {"kv_cache"}
    mem.sleep(("weights",))
    assert llm.calls == [("sleep", 2)] and mem.asleep == set(TAGS)
    mem.sleep(("weights",))    # idempotent
    mem.wake(("weights",))     # then the GPS Read loads them
    mem.wake(("kv_cache",))
    assert llm.calls == [("sleep", 2), ("wake_up", ("weights",)), ("wake_up", ("kv_cache",)),
                         ("reset_prefix_cache",)]
    assert mem.asleep == frozenset()
