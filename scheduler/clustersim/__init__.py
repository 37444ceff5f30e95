"""The analytic cluster simulator: job traces and their replay under a scheduling policy.

May import scheduler.policy and everything below it.
"""
