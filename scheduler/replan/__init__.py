"""Live re-planning: a device's speed change detected, a plan's cost under it, whether to switch.

May import scheduler.planning and everything below it.
"""
