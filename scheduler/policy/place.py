"""Configurations onto concrete device ids: keep what jobs hold, pack nodes.

Heuristic, in four passes (the integer program upstream has already made
sure every class has enough devices, so each pass always succeeds):

1. a job keeps as many of the devices it holds as its new configuration has
   of their class (a job whose configuration did not change keeps them all,
   so it is not moved);
2. jobs that already hold devices grow next to them, on the nodes they are on;
3. then the rest, largest first, each class best-fit: the node with the fewest
   free devices of that class that still holds the whole need, else the
   nodes with most free devices first — so jobs span as few nodes as the
   free devices allow and large holes stay whole for large jobs;
4. after the first pass and again after the others, a job whose devices of a
   class span more nodes than its own and the free devices would need is put
   back together, on the nodes where it holds most. Rates value an allocation
   that fits a node at one-node speed, so a job left split across nodes by an
   earlier, busier round would otherwise run at a fraction of that rate for
   good; the move happens when the devices to make it are free, and only ever
   lowers the number of nodes the job spans, so it is made once.
"""

from __future__ import annotations

from collections.abc import Iterable

from scheduler.hardware.cluster import Cluster
from scheduler.policy.rates import Config, DeviceClass


def place(
    cluster: Cluster,
    configs: dict[str, Config],
    held: dict[str, tuple[str, ...]],
) -> dict[str, tuple[str, ...]]:
    """Device ids for every job of ``configs`` (module docstring)."""
    order = {d.id: i for i, d in enumerate(cluster.devices)}
    class_of = {d.id: DeviceClass.of(d) for d in cluster.devices}
    node_of = {d.id: d.node for d in cluster.devices}
    free: dict[DeviceClass, dict[str, list[str]]] = {}
    for d in cluster.devices:
        free.setdefault(class_of[d.id], {}).setdefault(d.node, []).append(d.id)

    def take(ids: Iterable[str]) -> None:
        for i in ids:
            free[class_of[i]][node_of[i]].remove(i)

    out: dict[str, list[str]] = {job: [] for job in configs}
    for job, config in configs.items():
        mine = [i for i in held.get(job, ()) if i in class_of]
        for c, n in config.parts:
            same = [i for i in mine if class_of[i] == c]
            counts = _node_counts(same, node_of)
            same.sort(key=lambda i: (-counts[node_of[i]], order[i]))
            keep = same[:n]
            take(keep)
            out[job].extend(keep)

    def consolidate() -> None:
        for job in sorted(configs, key=lambda j: -configs[j].num_devices):
            for c, _ in configs[job].parts:
                mine = [i for i in out[job] if class_of[i] == c]
                together = _together(mine, free[c], node_of, order)
                if together is not None:
                    for i in mine:
                        free[c][node_of[i]].append(i)
                    take(together)
                    out[job] = [i for i in out[job] if class_of[i] != c] + together

    consolidate()  # what jobs kept, before growing them takes the room to do it

    def grow_key(job: str) -> tuple[int, int]:
        return (0 if out[job] else 1, -configs[job].num_devices)

    for job in sorted(configs, key=grow_key):
        for c, n in configs[job].parts:
            have = sum(1 for i in out[job] if class_of[i] == c)
            if n > have:
                out[job].extend(_pick(free[c], n - have, _node_counts(out[job], node_of)))
    consolidate()
    return {job: tuple(sorted(ids, key=order.__getitem__)) for job, ids in out.items()}


def _together(
    mine: list[str], free: dict[str, list[str]], node_of: dict[str, str], order: dict[str, int]
) -> list[str] | None:
    """``len(mine)`` devices of one class on fewer nodes than ``mine`` spans, from
    ``mine`` and ``free`` (node -> ids): the nodes where the job has most first, so it
    keeps as many of its devices as it can; None when no fewer nodes hold them."""
    if not mine:
        return None
    held = _node_counts(mine, node_of)
    room = {n: held.get(n, 0) + len(free.get(n, ())) for n in {*held, *free}}
    need, nodes = len(mine), []
    for node in sorted(room, key=lambda n: (-room[n], -held.get(n, 0), n)):
        if need <= 0:
            break
        nodes.append(node)
        need -= room[node]
    if len(nodes) >= len(held):
        return None
    need, picked = len(mine), []
    for node in nodes:
        own = sorted((i for i in mine if node_of[i] == node), key=order.__getitem__)
        spare = sorted(free.get(node, ()), key=order.__getitem__)
        take = (own + spare)[:need]
        picked.extend(take)
        need -= len(take)
    return picked


def _node_counts(ids: Iterable[str], node_of: dict[str, str]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for i in ids:
        counts[node_of[i]] = counts.get(node_of[i], 0) + 1
    return counts


def _pick(free: dict[str, list[str]], need: int, near: dict[str, int]) -> list[str]:
    """``need`` ids from ``free`` (node -> ids), nodes in ``near`` first, then best fit."""
    picked: list[str] = []
    for node in sorted(near, key=lambda n: -near[n]):
        while need and free.get(node):
            picked.append(free[node].pop(0))
            need -= 1
    if need:
        fitting = [n for n, ids in free.items() if len(ids) >= need]
        if fitting:
            node = min(fitting, key=lambda n: len(free[n]))
            picked.extend(free[node][:need])
            del free[node][:need]
            need = 0
    for node in sorted(free, key=lambda n: -len(free[n])):
        while need and free[node]:
            picked.append(free[node].pop(0))
            need -= 1
    if need:
        raise RuntimeError(f"placement: {need} devices short; the solver over-used a class")
    return picked
