"""Inside a device's worker: the actor, its dp and pipeline engines, rank specs, process groups.

May import workers.devices, workers.models, workers.data and workers' top-level modules.
"""
