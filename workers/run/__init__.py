"""A run's life in the driver: the step loop, checkpoints, recovery, re-planning, faults.

May import workers.cluster, workers.runtime and everything below them.
"""
