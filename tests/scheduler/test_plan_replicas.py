"""The per-kind search of hybrid plans gives what the per-pipeline one gives (issue 20).

:mod:`scheduler.planning.replicas` shares out micro-batches and prices the gradient
all-reduce once per kind of pipeline; :func:`scheduler.planning.stages.fits` decides
without partitioning; :func:`scheduler.planning.bounds.single_pipeline_lower_bound`
lets the hybrid planner skip the single pipeline. Each is held here to the function
it stands in for, on mixed clusters with ties, multi-stage pipelines across nodes
and a tied embedding.
"""

from __future__ import annotations

import random

import pytest

from scheduler.cost.profile import analytic_profile
from scheduler.hardware.cluster import parse_cluster
from scheduler.models.presets import get_preset
from scheduler.planning import hybrid, replicas
from scheduler.planning.bounds import single_pipeline_lower_bound
from scheduler.planning.pipeline import best_pipeline, layer_usable, micro_batch_candidates
from scheduler.planning.stages import (
    Chain,
    Stage,
    fits,
    in_flight_1f1b,
    partition,
    tied_embedding,
)
from tests.support import unit_device

TYPES = ["A100-80GB", "V100-16GB", "L4-24GB", "T4-16GB", "A10-24GB", "RTX3090-24GB"]


def _mixed(num_nodes: int, seed: int, per_node: int = 4) -> dict:
    rng = random.Random(seed)
    return {
        "name": "mix",
        "nodes": [
            {"name": f"n{i}", "devices": [{"type": rng.choice(TYPES)} for _ in range(per_node)]}
            for i in range(num_nodes)
        ],
    }


def _chain(total: float, slowest: float) -> Chain:
    """A two-stage chain taking ``total`` in all and ``slowest`` at its slowest stage."""
    times = (slowest, total - slowest)
    stages = tuple(
        Stage(device=unit_device(f"n/{s}"), first=s, last=s + 1, time_s=t, peak_bytes=0)
        for s, t in enumerate(times)
    )
    return Chain(stages=stages, micro_batch=1)


@pytest.mark.parametrize("seed", range(6))
def test_shares_per_kind_are_the_shares_per_pipeline(seed: int) -> None:
    """Micro-batches handed out per kind equal the heap over every pipeline, ties and
    all: kinds of equal cost interleave by pipeline index."""
    rng = random.Random(seed)
    kinds = [
        (rng.choice([2.0, 3.0]), rng.choice([1.0, 1.5]), rng.choice([0.0, 0.5])) for _ in range(4)
    ]
    kind_of = [rng.randrange(len(kinds)) for _ in range(rng.randint(5, 40))]
    used = sorted(set(kind_of))
    kind_of = [used.index(k) for k in kind_of]
    templates = [_chain(*kinds[k][:2]) for k in used]
    comm = [kinds[k][2] for k in used]
    members = tuple(
        tuple(j for j, k in enumerate(kind_of) if k == kind) for kind in range(len(used))
    )
    table = replicas.Replicas(
        groups=tuple(() for _ in kind_of),
        kind_of=tuple(kind_of),
        members=members,
        same_node=tuple(() for _ in used),
        node_codes=replicas.np.zeros((len(kind_of), 0), dtype=replicas.np.int64),
    )
    for num_micro in (1, 7, len(kind_of), 3 * len(kind_of) + 1, 200):
        expected = hybrid.allocate(
            [templates[k] for k in kind_of], [comm[k] for k in kind_of], num_micro
        )
        assert replicas.allocate(table, templates, comm, num_micro) == expected


@pytest.mark.parametrize(
    ("seed", "model", "micro_batch"),
    [(1, "gpt2-xl", 4), (2, "gpt2-medium", 2), (3, "gpt2-small", 8)],
)
def test_all_reduce_per_kind_is_the_all_reduce_per_pipeline(
    seed: int, model: str, micro_batch: int
) -> None:
    """The slowest device's gradient all-reduce priced per kind equals the per-pipeline
    price exactly (float for float), for pipelines of one node and pipelines chained
    across nodes, with every share of micro-batches."""
    profile = analytic_profile(parse_cluster(_mixed(6, seed)), get_preset(model))
    tied = tied_embedding(profile)
    partitioner = hybrid.Partitioner(tied)
    usable = layer_usable(profile)
    rng = random.Random(seed)
    for groups in (
        hybrid.group_by_node(usable, partitioner),
        hybrid.group_by_type(usable, partitioner, 1),
        hybrid.group_by_type(usable, partitioner, 2),
    ):
        table = replicas.Replicas.of(groups, partitioner.code)
        templates = [
            partitioner.template(table.first(k), micro_batch) for k in range(len(table.members))
        ]
        for _ in range(3):
            counts = [
                rng.choice([0, 1, 3]) if templates[table.kind_of[j]] is not None else 0
                for j in range(len(groups))
            ]
            if not any(counts):
                continue
            active = [partitioner(g, micro_batch) for g, n in zip(groups, counts, strict=True) if n]
            expected = hybrid.sync_s([c for c in active if c is not None], profile, tied)
            got = replicas.sync_s(
                table,
                templates,
                counts,
                gradient_bytes=profile.gradient_bytes,
                links=profile.links,
                tied=tied,
            )
            assert got == expected


@pytest.mark.parametrize(("seed", "model"), [(4, "gpt2-xl"), (5, "llama-7b"), (6, "llama-13b")])
def test_fits_says_what_partition_finds(seed: int, model: str) -> None:
    """Feasibility without the partition: the same answer on chains that fit and that
    do not (one to eight devices, small cards under a large model)."""
    profile = analytic_profile(parse_cluster(_mixed(4, seed)), get_preset(model))
    devices = layer_usable(profile)
    rng = random.Random(seed)
    answers = set()
    for _ in range(40):
        chain = rng.sample(devices, rng.randint(1, 8))
        for micro in (1, 4):
            flight = in_flight_1f1b(len(chain), None)
            found = partition(chain, micro_batch=micro, in_flight=flight) is not None
            assert fits(chain, micro_batch=micro, in_flight=flight) == found
            answers.add(found)
    assert answers == {True, False}


@pytest.mark.parametrize(
    ("seed", "model", "global_batch"), [(7, "gpt2-xl", 48), (8, "gpt2-small", 37)]
)
def test_single_pipeline_bound_is_below_the_best_single_pipeline(
    seed: int, model: str, global_batch: int
) -> None:
    profile = analytic_profile(parse_cluster(_mixed(2, seed)), get_preset(model))
    devices = layer_usable(profile)
    best = best_pipeline(devices, global_batch, links=profile.links, tied=tied_embedding(profile))
    assert best is not None
    bound = single_pipeline_lower_bound(devices, global_batch, micro_batch_candidates(global_batch))
    assert 0 < bound <= best.step_s
