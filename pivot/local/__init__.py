"""The ``local`` driver (docs/design.md): real tiny models on this machine's CPU. Monarch procs
stand in for devices; each device slot holds one in-process vLLM engine (policy or GenRM
weights, swapped on a shift) and a torchtitan trainer context; GPS holds both models."""
