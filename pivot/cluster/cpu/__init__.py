"""What only the ``cpu`` backend needs: each device slot is a Monarch proc of this machine,
held to a CPU share by a cgroup quota (``cgroups``), so that slots compete for cores the way
devices of a cluster do not share them."""
