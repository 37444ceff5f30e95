"""Ray plumbing: the warm worker pool, devices placed on Ray nodes, gathering, connecting.

May import workers.runtime (the actor class) and everything below it.
"""
