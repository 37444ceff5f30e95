"""Plans and their planners: plan types, dp, stages, pp, hybrid, auto, make_plan in front.

May import scheduler.cost, scheduler.hardware and scheduler.models.
"""
