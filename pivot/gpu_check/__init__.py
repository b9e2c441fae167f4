"""The parts of ``launchers/gpu_check.py``: what one GPU can check of the cluster driver's
cuda path before a run (``common``: setup and the peak copy; ``trainer``: the product's
trainer as the driver builds it; ``gps``: the GPS client's Write and Read of device
parameters)."""
