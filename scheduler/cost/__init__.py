"""What a device costs: profiles, per-piece figures, the roofline, the data-parallel cost model.

May import scheduler.hardware and scheduler.models.
"""
