"""The engine slot context's pure helpers (``pivot.roles.engine.slot_context``)."""

from pivot.roles.engine.slot_context import rendezvous_ports


def test_each_tp_block_gets_a_port_of_its_own_host_and_no_two_blocks_share_one():
    asked = []

    def free_on_host(h, n):
        asked.append((h, n))
        return [1000 * (h + 1) + i for i in range(n)]

    hosts = (0, 0, 0, 0, 1, 1, 1, 1)        # two hosts of 4 devices
    ports = rendezvous_ports({"policy": 2, "genrm": 4}, hosts, free_on_host)
    assert sorted(asked) == [(0, 3), (1, 3)]   # one question per host, for all its blocks
    assert ports["policy"] == (1000, 1001, 2000, 2001)   # blocks 0, 1 on host 0; 2, 3 on 1
    assert ports["genrm"] == (1002, 2002)
    assert rendezvous_ports({"policy": 1, "genrm": 1}, hosts, free_on_host) == {
        "policy": (), "genrm": ()}
    assert len(asked) == 2                     # TP 1 asks nothing
