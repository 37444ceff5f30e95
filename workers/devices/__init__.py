"""Devices, real and simulated: memory counting, pacing, host calibration, per-layer figures.

May import workers.models, workers.data and workers' top-level modules; never Ray.
"""
