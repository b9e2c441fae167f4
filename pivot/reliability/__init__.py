"""Reliability: the invariant checker, fault injectors and the simulated soak runner."""
