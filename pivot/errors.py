"""Errors raised on bad input. Each message names what is wrong and, where it can, the fix."""


class PivotError(Exception):
    """Base of every error PivotRL raises on purpose."""


class StateError(PivotError, ValueError):
    """Inconsistent state handed to the scheduler, planner or runtime. Never repaired."""


class ConfigError(PivotError, ValueError):
    """A bad configuration (gin file, binding, resource layout), raised before any work."""
