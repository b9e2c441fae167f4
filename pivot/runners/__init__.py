"""Runners: what builds a driver from gin files and runs it (the simulated experiments, the
soak, the bad-input table). They sit above the gin registry (``pivot.gin_setup``), which
imports every package whose classes gin files name; docs/design.md, "Layering"."""
