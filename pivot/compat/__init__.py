"""Workarounds of third-party internals, one module per library.

Every place where PivotRL reaches below a library's public surface (private attributes and
modules, monkeypatches, environment knobs, behaviour of one version) lives in one of:

- ``pivot.compat.vllm``: the CPU build of vLLM (in-process engine, KV and weight release
  without sleep mode, the CPU ``cpu_linear`` closures);
- ``pivot.compat.torchtitan``: the Qwen3 builder's private pieces, the SDPA attention swap
  for CPU, FSDP2 over gloo, the fused-QKV load hook;
- ``pivot.compat.monarch``: the one owner of ``monarch.actor.unhandled_fault_hook``, the
  client's socket folder, the actor prefix of its log records;
- ``pivot.compat.nixl``: the agent constructor of ``nixl._api``, the bytes returned by
  ``add_remote_agent``, the UCX progress thread, transfer states.

Each module names the version it was written for (``WRITTEN_FOR``) and each shim says what
it works around. ``tests/compat/`` fails when an upgrade breaks one: it checks the installed
versions and every private name a shim relies on. No module here imports its library at
import time; the shims import it when called.
"""
