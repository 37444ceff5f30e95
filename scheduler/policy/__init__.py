"""Which devices each job holds: fifo, fair and goodput, their rates, configurations, solver.

May import scheduler.cost, scheduler.hardware and scheduler.models (not scheduler.planning).
"""
