"""A run's life in the driver: settings and hooks, the step loop, checkpoints, recovery, faults.

May import workers.cluster, workers.runtime and everything below them.
"""
