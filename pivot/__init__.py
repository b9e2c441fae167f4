"""PivotRL: resource-shiftable RL post-training with generative rewards.

The package follows the paper's parts (arXiv:2610.16866): ``scheduler`` (sec. 6, app. C),
``planner`` (sec. 7, app. D), ``gps`` (sec. 5.1, app. B), ``shifting`` (sec. 5.2),
``sim`` (the cluster-simulator driver), ``roles`` (real engines) and ``rl`` (the loop).
Everything under ``scheduler`` and ``planner`` is pure Python over the dataclasses in
``pivot.types`` and imports no engine.
"""

__version__ = "0.1.0"
