"""Stand-ins and builders for tests and benchmarks only (like ``torch.testing``).

Nothing in the product imports this package (``tests/test_layering.py`` fails if a module
outside ``pivot/testing/`` does); ``tests/`` and the benchmarks (``launchers/bench_*``,
``launchers/profile_*``) do. It lives under ``pivot/`` rather than ``tests/`` so that the
benchmarks, and subprocesses a test starts, can import it from the installed package.

Submodules mirror the product packages they stand in for; import them directly (this
``__init__`` imports nothing, so ``import pivot.testing`` stays cheap):

- ``shifting``: ``TinyMLP`` and the torch-state role contexts ``InferenceContext`` and
  ``TrainingContext``; ``InMemoryParameterSource``.
- ``gps``: ``LocalHost`` (an in-process GPS host handle, no actor) and builders of random
  models, states, shards and layouts.
- ``strategies``: hypothesis strategies (needs the ``test`` extra: ``pip install .[test]``).
- ``reference_greedy``: the scan-based GPS sender greedy the fast one must equal.
- ``reference_planner``: the former full-scan candidate construction and evaluation
  the incremental planner must equal.
- ``planner``: a synthetic 32-device ``WorkloadSnapshot`` and its throughput model.
- ``rl``: ``ManualClock``, in-memory RL-loop ports and ``fake_loop``.
- ``reliability``: ``StaticSource`` (a ``LiveSource`` over a mutated ``ControlState``).
- ``engine``: ``random_state_dict``, fresh random weights for a tiny Qwen3 folder.
- ``generator``: ``GeneratorActor`` (one vLLM engine behind a Monarch actor of its own,
  outside a device slot), ``ActorHandle`` and ``spawn_generators``.
- ``runtime``: ``spawn_per_host`` (one service actor per host of an allocation).
- ``replicas``: ``two_slot_mesh`` (a TP or EP replica of two slots over one GPS) and
  ``generate`` (greedy tokens through the controller).
"""
