"""hetsched's pure planning core.

Cluster specs, the GPU catalogue, model presets, profiles, the cost model and
the planners. Nothing here imports torch, ray or fastapi (a test keeps it so),
so it is fast to test and usable offline for what-if planning at any scale.
"""
