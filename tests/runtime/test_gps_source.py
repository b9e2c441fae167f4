"""The GPS Write lease holder of a slot (sec. 5.1)."""

from pivot.runtime.gps_source import writer_id


def test_a_slot_writes_under_its_device_id_and_the_client_under_its_pid(monkeypatch):
    import os
    assert writer_id(3) == "slot3"
    monkeypatch.setenv("PIVOT_SLOT_DEVICE", "2")
    assert writer_id() == "slot2"
    monkeypatch.delenv("PIVOT_SLOT_DEVICE")
    assert writer_id() == f"client{os.getpid()}"


def test_fsdp_read_layouts_split_rows_only_where_they_line_up_with_fsdp2():
    from pivot.gps.layout import qwen3_model
    from pivot.runtime.gps_source import FsdpShardLayouts
    from pivot.types import POLICY, Role

    meta = qwen3_model(POLICY, layers=2, hidden=128, intermediate=384, heads=4, kv_heads=2,
                       head_dim=32, vocab=512)
    layouts = FsdpShardLayouts({POLICY: meta}, {POLICY: 2})
    two = layouts(Role.TRAINING, (1, 3))
    assert two.tp == 2 and {d for _, d in two.split_dims} == {0}
    assert layouts(Role.TRAINING, (0,)) is None          # one rank: a full copy
    assert layouts(Role.TRAINING, (0, 1, 2, 3)) is None  # 4 ranks split 2 KV heads unevenly
    assert layouts(Role.ROLLOUT, (0, 1)) is None         # no inference layout given
    odd = qwen3_model(POLICY, layers=1, hidden=64, intermediate=96, heads=2, kv_heads=2,
                      head_dim=32, vocab=510)            # 510 rows do not halve into 2 x 256
    assert FsdpShardLayouts({POLICY: odd}, {POLICY: 2})(Role.TRAINING, (0, 1)).tp == 2
    assert FsdpShardLayouts({POLICY: odd}, {POLICY: 2})(Role.TRAINING, (0, 1, 2)) is None
