"""Planner fixtures; the workload itself is ``pivot.testing.planner.make_snapshot`` (module
level, as the hypothesis strategies of test_planner_properties.py build on it)."""

import pytest

from pivot.testing.planner import make_snapshot


@pytest.fixture
def snapshot():
    """The default snapshot: 3 busy rollout replicas, loaded reward replicas, 100 waiting."""
    return make_snapshot()
