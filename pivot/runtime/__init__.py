"""The resource-shiftable runtime's Monarch edge (sec. 5): provisioning, device slots and
the mesh controller. The logic it runs lives in ``pivot.shifting`` (pure)."""
