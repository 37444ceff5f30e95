"""What a cluster is made of: specs, the GPU catalogue, real GPU names, usable memory, faults.

Imports only scheduler.errors and scheduler.units.
"""
