"""The role-shifting mechanism as data: context categories, actions, and slot transitions.

Sec. 5.2 ("Categorizing role context", "Shift down and shift up", "Shifting granularity"):
every role declares its context items in four categories; a shift down applies one action
per category (discard / discard / offload / keep) and a shift up the matching one
(reallocate / Read from GPS / reload / keep). Rollout and reward shift one replica at a
time, training as a whole.

The second table is the device-slot state machine the ``DeviceMap`` enforces: a device is
idle, active in one role, shifting down out of a role, shifting up into a role, or lost.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from pivot.types import Role


class ContextCategory(enum.Enum):
    """The four kinds of role context (sec. 5.2, fig. 6)."""

    TEMPORARY = "temporary"
    """Stateless, rebuilt by recomputation: KV cache, activations, temporary buffers."""
    PARAMETERS = "parameters"
    """Stateless because GPS holds every model: discard, Read back."""
    OFFLOADABLE = "offloadable"
    """Stateful, not needed on the device while another role runs: optimizer state,
    gradients, persistent training state, engine (CUDA) graphs."""
    PRESERVED = "preserved"
    """Stateful and small: process groups, device context, engine definitions."""


class ShiftAction(enum.Enum):
    """What a shift does to one context item."""

    DISCARD = "discard"
    OFFLOAD = "offload"
    KEEP = "keep"
    REALLOCATE = "reallocate"
    READ = "read"
    RELOAD = "reload"


SHIFT_DOWN_ACTION: dict[ContextCategory, ShiftAction] = {
    ContextCategory.TEMPORARY: ShiftAction.DISCARD,
    ContextCategory.PARAMETERS: ShiftAction.DISCARD,
    ContextCategory.OFFLOADABLE: ShiftAction.OFFLOAD,
    ContextCategory.PRESERVED: ShiftAction.KEEP,
}
"""Shift down of the old role (fig. 6, left)."""

SHIFT_UP_ACTION: dict[ContextCategory, ShiftAction] = {
    ContextCategory.TEMPORARY: ShiftAction.REALLOCATE,
    ContextCategory.PARAMETERS: ShiftAction.READ,
    ContextCategory.OFFLOADABLE: ShiftAction.RELOAD,
    ContextCategory.PRESERVED: ShiftAction.KEEP,
}
"""Shift up of the new role (fig. 6, right)."""

SHIFT_DOWN_ORDER: tuple[ContextCategory, ...] = (
    ContextCategory.TEMPORARY, ContextCategory.PARAMETERS,
    ContextCategory.OFFLOADABLE, ContextCategory.PRESERVED,
)
"""Free the cheapest-to-rebuild memory first."""

SHIFT_UP_ORDER: tuple[ContextCategory, ...] = (
    ContextCategory.PRESERVED, ContextCategory.PARAMETERS,
    ContextCategory.OFFLOADABLE, ContextCategory.TEMPORARY,
)
"""Read parameters, then reload state (gradients attach to the parameters they belong to),
then reserve temporary memory (lazily rebuilt)."""


@dataclass(frozen=True, slots=True)
class ContextItem:
    """One named piece of a role's device context."""

    name: str
    category: ContextCategory


ROLE_CONTEXT: dict[Role, tuple[ContextItem, ...]] = {
    Role.ROLLOUT: (
        ContextItem("kv_cache", ContextCategory.TEMPORARY),
        ContextItem("weights", ContextCategory.PARAMETERS),
        ContextItem("engine_graphs", ContextCategory.OFFLOADABLE),
        ContextItem("engine_definition", ContextCategory.PRESERVED),
    ),
    Role.REWARD: (
        ContextItem("kv_cache", ContextCategory.TEMPORARY),
        ContextItem("weights", ContextCategory.PARAMETERS),
        ContextItem("engine_graphs", ContextCategory.OFFLOADABLE),
        ContextItem("engine_definition", ContextCategory.PRESERVED),
    ),
    Role.TRAINING: (
        ContextItem("activations", ContextCategory.TEMPORARY),
        ContextItem("weights", ContextCategory.PARAMETERS),
        ContextItem("optimizer_state", ContextCategory.OFFLOADABLE),
        ContextItem("gradients", ContextCategory.OFFLOADABLE),
        ContextItem("process_group", ContextCategory.PRESERVED),
    ),
}
"""The context each role declares (sec. 5.2). A role context object implements one
handler per (category, action) pair for its items."""


class Granularity(enum.Enum):
    """How much of a role moves in one shift (sec. 5.2, "Shifting granularity")."""

    REPLICA = "replica"
    WHOLE = "whole"


SHIFT_GRANULARITY: dict[Role, Granularity] = {
    Role.ROLLOUT: Granularity.REPLICA,
    Role.REWARD: Granularity.REPLICA,
    Role.TRAINING: Granularity.WHOLE,
}


@dataclass(frozen=True, slots=True)
class ShiftStep:
    """One action on one context category; ``phase`` names it in events and reports."""

    category: ContextCategory
    action: ShiftAction
    items: tuple[str, ...]

    @property
    def phase(self) -> str:
        return f"{self.action.value}_{self.category.value}"


def _steps(role: Role, order: tuple[ContextCategory, ...],
           table: dict[ContextCategory, ShiftAction]) -> tuple[ShiftStep, ...]:
    items = ROLE_CONTEXT[Role.parse(role)]
    steps = []
    for cat in order:
        names = tuple(i.name for i in items if i.category is cat)
        if names:
            steps.append(ShiftStep(cat, table[cat], names))
    return tuple(steps)


def shift_down_steps(role: Role) -> tuple[ShiftStep, ...]:
    """The ordered steps of shifting ``role`` down (sec. 5.2)."""
    return _steps(role, SHIFT_DOWN_ORDER, SHIFT_DOWN_ACTION)


def shift_up_steps(role: Role) -> tuple[ShiftStep, ...]:
    """The ordered steps of shifting ``role`` up (sec. 5.2)."""
    return _steps(role, SHIFT_UP_ORDER, SHIFT_UP_ACTION)


class SlotKind(enum.Enum):
    """The state of one device slot."""

    IDLE = "idle"
    ACTIVE = "active"
    SHIFTING_DOWN = "shifting_down"
    SHIFTING_UP = "shifting_up"
    LOST = "lost"


class Transition(enum.Enum):
    """The changes a slot's state may undergo."""

    BEGIN_DOWN = "begin_down"
    END_DOWN = "end_down"
    BEGIN_UP = "begin_up"
    END_UP = "end_up"
    FAIL = "fail"
    """The process died, or a shift step raised and the slot's contents are unknown."""
    RECOVER = "recover"
    """The controller reset (or respawned) the slot: it holds no role."""


SLOT_TRANSITIONS: dict[tuple[SlotKind, Transition], SlotKind] = {
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
"""Every allowed (state, transition) pair; anything else is a StateError."""


def next_kind(kind: SlotKind, transition: Transition) -> SlotKind | None:
    """The state after ``transition`` from ``kind``, or None if it is not allowed."""
    return SLOT_TRANSITIONS.get((kind, transition))
