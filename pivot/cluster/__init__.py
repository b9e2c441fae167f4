"""The cluster driver (docs/design.md): real RL post-training with resource shifting on
real devices. The same code runs every backend (``pivot.runtime.backend``): ``cpu`` device
slots on this machine (Monarch procs capped by cgroup quotas, ``pivot.cluster.cpu``) and
``cuda`` hosts of one GPU per slot, as local processes or SLURM / Kubernetes jobs. Each
slot holds two sleeping vLLM engines (policy and GenRM) and a torchtitan trainer context;
GPS, one actor per host, holds both models."""
