"""Role context objects: what a device slot holds for a role, by category (sec. 5.2).

A context implements one method per action of ``role_shift``'s tables; ``apply_steps``
walks a role's shift-down or shift-up steps and times each phase. Contexts are built once
per slot when the slot is spawned (their preserved part, e.g. an engine definition, lives
for the whole run) and are shifted, never rebuilt.

The vLLM engine (``pivot.roles.generator.GeneratorContext``) and the torchtitan trainer
(``pivot.roles.trainer``) plug in by implementing ``RoleContext``; tests and benchmarks use
the torch-state stand-ins of ``pivot.testing.shifting``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Protocol

from pivot.shifting.params import StateDict
from pivot.shifting.role_shift import ContextCategory, ShiftAction, ShiftStep
from pivot.types import Role


class RoleContext(Protocol):
    """One role's context in one slot."""

    role: Role
    model: str

    def discard(self, category: ContextCategory) -> None: ...
    def offload(self, category: ContextCategory) -> None: ...
    def reload(self, category: ContextCategory) -> None: ...
    def reallocate(self, category: ContextCategory) -> None: ...
    def load_parameters(self, state: StateDict) -> None: ...
    def describe(self) -> dict[str, Any]: ...


def apply_steps(ctx: RoleContext, steps: tuple[ShiftStep, ...],
                read: Callable[[], StateDict]) -> dict[str, float]:
    """Applies ``steps`` to ``ctx``; returns phase -> seconds.

    A READ step is split into ``gps_read`` (the transfer) and ``load_parameters``.
    KEEP steps cost nothing and are reported as 0 so every declared category shows up.
    """
    phases: dict[str, float] = {}
    for step in steps:
        t = time.perf_counter()
        if step.action is ShiftAction.DISCARD:
            ctx.discard(step.category)
        elif step.action is ShiftAction.OFFLOAD:
            ctx.offload(step.category)
        elif step.action is ShiftAction.RELOAD:
            ctx.reload(step.category)
        elif step.action is ShiftAction.REALLOCATE:
            ctx.reallocate(step.category)
        elif step.action is ShiftAction.READ:
            state = read()
            phases["gps_read"] = time.perf_counter() - t
            t = time.perf_counter()
            ctx.load_parameters(state)
            phases["load_parameters"] = time.perf_counter() - t
            continue
        phases[step.phase] = time.perf_counter() - t
    return phases
