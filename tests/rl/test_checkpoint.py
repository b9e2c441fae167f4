"""Checkpoints: a corrupt state.pt is a clear StateError, and resuming skips it for the
previous checkpoint that ``save`` kept."""

import logging

import pytest

from pivot.errors import ConfigError, StateError
from pivot.rl import checkpoint


def _truncate(path):
    f = path / "state.pt"
    f.write_bytes(f.read_bytes()[:40])


def test_a_truncated_state_pt_is_a_state_error_naming_the_file(tmp_path):
    path = checkpoint.save(tmp_path, 1, {"policy_version": 1})
    _truncate(path)
    with pytest.raises(StateError, match=r"state\.pt is corrupt.*previous checkpoint"):
        checkpoint.load(path)
    (path / "state.pt").unlink()
    with pytest.raises(ConfigError, match="no state.pt"):
        checkpoint.load(path)


def test_load_latest_falls_back_to_the_previous_checkpoint_and_logs_it(tmp_path, caplog):
    assert checkpoint.load_latest(tmp_path) is None
    checkpoint.save(tmp_path, 1, {"step": 1})
    newest = checkpoint.save(tmp_path, 2, {"step": 2})
    assert checkpoint.load_latest(tmp_path) == (newest, {"step": 2})
    _truncate(newest)
    with caplog.at_level(logging.WARNING, logger="pivot.rl.checkpoint"):
        path, state = checkpoint.load_latest(tmp_path)
    assert path.name == "step_000001" and state == {"step": 1}
    assert "older checkpoint" in caplog.text and "step_000002" in caplog.text


def test_load_latest_raises_when_no_checkpoint_loads(tmp_path):
    for step in (1, 2):
        _truncate(checkpoint.save(tmp_path, step, {"step": step}))
    with pytest.raises(StateError, match="no checkpoint .* loads"):
        checkpoint.load_latest(tmp_path)
