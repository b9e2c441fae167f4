"""The role-shift tables (sec. 5.2), checked exhaustively."""

import itertools

import pytest

from pivot.errors import StateError
from pivot.shifting.role_shift import (
    ROLE_CONTEXT, SHIFT_DOWN_ACTION, SHIFT_GRANULARITY, SHIFT_UP_ACTION, SLOT_TRANSITIONS,
    ContextCategory, Granularity, ShiftAction, SlotKind, Transition, next_kind,
    shift_down_steps, shift_up_steps,
)
from pivot.types import Role

EXPECTED = {
    (SlotKind.ACTIVE, Transition.BEGIN_DOWN): SlotKind.SHIFTING_DOWN,
    (SlotKind.SHIFTING_DOWN, Transition.END_DOWN): SlotKind.IDLE,
    (SlotKind.IDLE, Transition.BEGIN_UP): SlotKind.SHIFTING_UP,
    (SlotKind.SHIFTING_UP, Transition.END_UP): SlotKind.ACTIVE,
    (SlotKind.IDLE, Transition.FAIL): SlotKind.LOST,
    (SlotKind.ACTIVE, Transition.FAIL): SlotKind.LOST,
    (SlotKind.SHIFTING_DOWN, Transition.FAIL): SlotKind.LOST,
    (SlotKind.SHIFTING_UP, Transition.FAIL): SlotKind.LOST,
    (SlotKind.LOST, Transition.RECOVER): SlotKind.IDLE,
}


@pytest.mark.parametrize("kind,transition", list(itertools.product(SlotKind, Transition)))
def test_every_state_and_transition_pair_is_allowed_only_as_the_paper_says(kind, transition):
    assert next_kind(kind, transition) is EXPECTED.get((kind, transition))


def test_the_slot_table_has_no_entries_beyond_the_expected_ones():
    assert SLOT_TRANSITIONS == EXPECTED


def test_shift_down_discards_stateless_offloads_offloadable_and_keeps_preserved():
    assert SHIFT_DOWN_ACTION == {
        ContextCategory.TEMPORARY: ShiftAction.DISCARD,
        ContextCategory.PARAMETERS: ShiftAction.DISCARD,
        ContextCategory.OFFLOADABLE: ShiftAction.OFFLOAD,
        ContextCategory.PRESERVED: ShiftAction.KEEP,
    }


def test_shift_up_reallocates_reads_reloads_and_keeps():
    assert SHIFT_UP_ACTION == {
        ContextCategory.TEMPORARY: ShiftAction.REALLOCATE,
        ContextCategory.PARAMETERS: ShiftAction.READ,
        ContextCategory.OFFLOADABLE: ShiftAction.RELOAD,
        ContextCategory.PRESERVED: ShiftAction.KEEP,
    }


@pytest.mark.parametrize("role", list(Role))
def test_every_role_declares_temporary_parameters_and_preserved_context(role):
    cats = {i.category for i in ROLE_CONTEXT[role]}
    assert {ContextCategory.TEMPORARY, ContextCategory.PARAMETERS,
            ContextCategory.PRESERVED} <= cats
    names = [i.name for i in ROLE_CONTEXT[role]]
    assert len(names) == len(set(names))


def test_training_offloads_optimizer_state_and_gradients():
    off = {i.name for i in ROLE_CONTEXT[Role.TRAINING]
           if i.category is ContextCategory.OFFLOADABLE}
    assert off == {"optimizer_state", "gradients"}


@pytest.mark.parametrize("role", list(Role))
def test_steps_cover_every_declared_item_once_in_table_order(role):
    for steps, table in ((shift_down_steps(role), SHIFT_DOWN_ACTION),
                         (shift_up_steps(role), SHIFT_UP_ACTION)):
        covered = [n for s in steps for n in s.items]
        assert sorted(covered) == sorted(i.name for i in ROLE_CONTEXT[role])
        for s in steps:
            assert s.action is table[s.category]
            assert s.phase == f"{s.action.value}_{s.category.value}"
    assert shift_down_steps(role)[0].category is ContextCategory.TEMPORARY
    assert shift_up_steps(role)[-1].category is ContextCategory.TEMPORARY


def test_inference_shifts_per_replica_and_training_as_a_whole():
    assert SHIFT_GRANULARITY == {Role.ROLLOUT: Granularity.REPLICA,
                                 Role.REWARD: Granularity.REPLICA,
                                 Role.TRAINING: Granularity.WHOLE}


def test_an_unknown_role_name_is_refused():
    with pytest.raises(StateError, match="unknown role 'critic'"):
        shift_down_steps("critic")


def test_shift_up_reads_parameters_before_reloading_gradients_onto_them():
    order = [s.category for s in shift_up_steps(Role.TRAINING)]
    assert order.index(ContextCategory.PARAMETERS) < order.index(ContextCategory.OFFLOADABLE)
