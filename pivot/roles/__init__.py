"""The role engines: the vLLM generator replica (rollout and reward, ``generator``,
``engine/``) and the torchtitan trainer (``trainer``, ``titan/``), sec. 4 and 5.2."""
