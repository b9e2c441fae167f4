"""Checks of configured values, shared by every gin-configurable class.

Each configurable checks its fields at construction (``__post_init__`` or ``__init__``),
before any process or engine starts, with these helpers. A failed check raises
``ConfigError`` naming the gin binding, the value given and what is valid::

    CpuConfig.share=3.0: must be a number in [0, 2] (fraction of one core per slot...)

``default_of`` reads a class's own default, for layers that forward a setting (an argparse
default, a factory) and so must not keep a default of their own.
"""

from __future__ import annotations

import inspect
import math
import re
from collections.abc import Callable
from numbers import Integral, Real
from typing import Any, TypeVar

import gin

from pivot.errors import ConfigError


def fail(binding: str, value: Any, need: str) -> None:
    """Raises the ConfigError every check raises: ``binding=value: need``."""
    raise ConfigError(f"{binding}={value!r}: {need}")


def check(ok: bool, binding: str, value: Any, need: str) -> None:
    """A custom or cross-field check: fails with ``need`` unless ``ok``."""
    if not ok:
        fail(binding, value, need)


def _bound(lo: float | None, hi: float | None, open_lo: bool, open_hi: bool) -> str:
    def f(x: float) -> str:
        return str(x) if isinstance(x, int) else f"{x:g}"
    if lo is not None and hi is not None:
        return f"in {'(' if open_lo else '['}{f(lo)}, {f(hi)}{')' if open_hi else ']'}"
    if lo is not None:
        return f"{'>' if open_lo else '>='} {f(lo)}"
    if hi is not None:
        return f"{'<' if open_hi else '<='} {f(hi)}"
    return "finite"


def check_range(binding: str, value: Any, lo: float | None = None, hi: float | None = None,
                *, integer: bool = False, open_lo: bool = False, open_hi: bool = False,
                optional: bool = False, why: str = "") -> None:
    """``value`` is a finite number (an int if ``integer``; None too if ``optional``) within
    ``lo``..``hi`` (either may be None; ``open_lo`` / ``open_hi`` exclude the bound).
    ``why`` follows the range in the message (what the setting is, the fix)."""
    if optional and value is None:
        return
    kind = "an integer" if integer else "a number"
    need = f"must be {kind} {_bound(lo, hi, open_lo, open_hi)}"
    if optional:
        need += " (or None)"
    if why:
        need += f" ({why})"
    if isinstance(value, bool) or not isinstance(value, Integral if integer else Real):
        fail(binding, value, need)
    if not math.isfinite(value):
        fail(binding, value, need)
    if lo is not None and (value <= lo if open_lo else value < lo):
        fail(binding, value, need)
    if hi is not None and (value >= hi if open_hi else value > hi):
        fail(binding, value, need)


def check_bool(binding: str, value: Any) -> None:
    """``value`` is True or False (not a truthy string or number)."""
    check(isinstance(value, bool), binding, value, "must be True or False")


def check_text(binding: str, value: Any, optional: bool = False) -> None:
    """``value`` is a non-empty string (or None if ``optional``)."""
    if optional and value is None:
        return
    check(isinstance(value, str) and bool(value.strip()), binding, value,
          "must be a non-empty string" + (" (or None)" if optional else ""))


def default_of(cls: Any, name: str) -> Any:
    """The default of parameter ``name`` in ``cls``'s signature (a class, dataclass or
    function, gin-wrapped or not): what a forwarding layer takes instead of its own."""
    p = inspect.signature(cls).parameters.get(name)
    if p is None or p.default is inspect.Parameter.empty or p.default is gin.REQUIRED:
        raise TypeError(f"{getattr(cls, '__name__', cls)} has no default for {name!r}")
    return p.default


T = TypeVar("T")


def build_required(build: Callable[[], T], fix: str) -> T:
    """``build()`` of a setting with required bindings (``gin.REQUIRED``); gin's error for
    a missing one becomes a ConfigError naming each binding and ``fix``."""
    try:
        return build()
    except RuntimeError as e:
        m = re.search(r"Required bindings for `(\w+)` not provided in config: \[(.*?)\]",
                      str(e))
        if m is None:
            raise
        names = ", ".join(f"{m.group(1)}.{n.strip(chr(39))}" for n in m.group(2).split(", "))
        raise ConfigError(f"{names}: required (no default), not bound; {fix}") from None
