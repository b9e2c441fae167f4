"""The GPS Write lease holder of a slot (sec. 5.1; issue 15, item 4)."""

from pivot.runtime.gps_source import writer_id


def test_a_slot_writes_under_its_device_id_and_the_client_under_its_pid(monkeypatch):
    import os
    assert writer_id(3) == "slot3"
    monkeypatch.setenv("PIVOT_SLOT_DEVICE", "2")
    assert writer_id() == "slot2"
    monkeypatch.delenv("PIVOT_SLOT_DEVICE")
    assert writer_id() == f"client{os.getpid()}"
