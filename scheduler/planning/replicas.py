"""A hybrid plan's pipelines grouped by kind, and what they cost, computed once per kind.

A hybrid plan over thousands of GPUs has thousands of pipelines but few distinct
ones: two pipelines are of one *kind* when their stages hold devices of the same
figures in the same order with the same node boundaries between them, so they
partition alike, take the same time per micro-batch and pay the same activation
transfers. :class:`Replicas` groups the pipelines of one grouping once; the search
(:func:`scheduler.planning.hybrid.evaluate`) then partitions, prices and shares out
micro-batches per kind, and builds device-bound chains only for the plan it keeps
(issue 20: per pipeline, the same work was most of a 4,096-device hybrid plan).

Each function here gives exactly what its per-pipeline counterpart gives
(:func:`~scheduler.planning.hybrid.allocate`, :func:`~scheduler.planning.hybrid.sync_s`,
:func:`~scheduler.planning.stages.boundary_s`), the same floating-point sums in the
same order, so the plan does not change; ``tests/scheduler/test_plan_identity.py``
holds them to it.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from scheduler.cost.costmodel import ring_allreduce_s
from scheduler.cost.profile import DeviceProfile
from scheduler.hardware.cluster import Links
from scheduler.planning.stages import Chain, Stage, Tied, layers_of, transfer_s

Group = tuple[DeviceProfile, ...]
IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True, kw_only=True, slots=True)
class Replicas:
    """The pipelines of one grouping (devices in stage order) and their kinds."""

    groups: tuple[Group, ...]
    kind_of: tuple[int, ...]
    """Each pipeline's kind."""
    members: tuple[tuple[int, ...], ...]
    """Each kind's pipelines, in order."""
    same_node: tuple[tuple[bool, ...], ...]
    """Per kind, whether each pair of consecutive stages shares a node."""
    node_codes: IntArray
    """``(pipelines, longest)``: the node of each stage's device as an index (-1: none)."""

    @classmethod
    def of(cls, groups: Sequence[Group], code: Callable[[DeviceProfile], int]) -> Replicas:
        """``groups`` by kind; ``code``: a device's figures as an index (two devices of
        one index are interchangeable in a partition)."""
        kinds: dict[tuple[object, ...], int] = {}
        kind_of: list[int] = []
        members: list[list[int]] = []
        same_node: list[tuple[bool, ...]] = []
        nodes: dict[str, int] = {}
        longest = max((len(g) for g in groups), default=0)
        rows = []
        for j, group in enumerate(groups):
            pattern = tuple(a.node == b.node for a, b in zip(group, group[1:], strict=False))
            key = (tuple(map(code, group)), pattern)
            kind = kinds.get(key)
            if kind is None:
                kind = kinds[key] = len(members)
                members.append([])
                same_node.append(pattern)
            kind_of.append(kind)
            members[kind].append(j)
            row = [nodes.setdefault(d.node, len(nodes)) for d in group]
            rows.append(row + [-1] * (longest - len(row)))
        node_codes = np.array(rows, dtype=np.int64).reshape(len(groups), longest)
        return cls(
            groups=tuple(groups),
            kind_of=tuple(kind_of),
            members=tuple(tuple(m) for m in members),
            same_node=tuple(same_node),
            node_codes=node_codes,
        )

    def first(self, kind: int) -> Group:
        """The first pipeline of ``kind``."""
        return self.groups[self.members[kind][0]]


def boundary_s(template: Chain, same_node: Sequence[bool], links: Links) -> float:
    """:func:`scheduler.planning.stages.boundary_s` of a pipeline partitioned as
    ``template`` whose consecutive stages share a node where ``same_node`` says (which
    node is not known here: a cluster whose nodes differ is priced at its slowest)."""
    total = 0.0
    for a, same in zip(template.stages, same_node, strict=False):
        gbps = links.slowest_within if same else links.slowest_card
        total += 2 * transfer_s(
            template.micro_batch * layers_of(a.device).boundary_bytes_per_sample, gbps
        )
    return total


def allocate(
    replicas: Replicas,
    templates: Sequence[Chain | None],
    pipe_comm_s: Sequence[float],
    num_micro_batches: int,
) -> list[int]:
    """Micro-batches per pipeline (0 for a kind without a partition), as
    :func:`scheduler.planning.hybrid.allocate` hands them out over the partitioned
    pipelines in order: one by one to the pipeline that would finish earliest with it,
    ties to the lower index.

    Pipelines of one kind finish alike, so they take their next micro-batch in index
    order while the kind's cost stays below every other kind's: the heap holds one entry
    per kind (its next pipeline) and a pop hands the kind's run of pipelines at once,
    stopping, on a tie in cost, before the pipeline of the next entry's index."""
    level = [0] * len(templates)
    promoted = [0] * len(templates)
    total = [0.0 if c is None else c.total_s for c in templates]
    slowest = [0.0 if c is None else c.slowest_s for c in templates]
    heap = [
        (total[k] + pipe_comm_s[k], replicas.members[k][0], k)
        for k, c in enumerate(templates)
        if c is not None
    ]
    heapq.heapify(heap)
    left = num_micro_batches
    while left > 0 and heap:
        cost, _, k = heapq.heappop(heap)
        members = replicas.members[k]
        first, end = promoted[k], len(members)
        if heap and heap[0][0] == cost:
            end = max(bisect.bisect_left(members, heap[0][1], first, end), first + 1)
        take = min(end - first, left)
        promoted[k] += take
        left -= take
        if promoted[k] == len(members):
            level[k] += 1
            promoted[k] = 0
        value = total[k] + level[k] * slowest[k] + pipe_comm_s[k]
        heapq.heappush(heap, (value, members[promoted[k]], k))
    counts = [0] * len(replicas.groups)
    for k, members in enumerate(replicas.members):
        if templates[k] is not None:
            for r, j in enumerate(members):
                counts[j] = level[k] + (1 if r < promoted[k] else 0)
    return counts


def sync_s(
    replicas: Replicas,
    templates: Sequence[Chain | None],
    counts: Sequence[int],
    *,
    gradient_bytes: int,
    links: Links,
    tied: Tied,
) -> float:
    """:func:`scheduler.planning.hybrid.sync_s` of the pipelines with micro-batches.

    The pieces of the model (the embedding, each block, the head; positions 0 to
    ``L + 1`` in that order) with the same holders form one all-reduce: runs of positions
    between the union of every active pipeline's stage boundaries. Each run's bytes are
    summed in the order the per-pipeline function meets its pieces (blocks, then the
    embedding, then the head), its ring is intra-node when all its holders share a
    node, and a device pays the rings of its stage's runs in order, then the tied
    embedding's; the step pays the slowest (kind, stage)."""
    active = [j for j, n in enumerate(counts) if n > 0]
    if not active:
        return 0.0
    kinds = sorted({replicas.kind_of[j] for j in active})
    chain0 = templates[replicas.kind_of[active[0]]]
    assert chain0 is not None
    lp = layers_of(chain0.stages[0].device)
    num_blocks = lp.num_blocks
    total_static = lp.embed.static_bytes + num_blocks * lp.block.static_bytes + lp.head.static_bytes
    ratio = gradient_bytes / total_static if total_static else 0.0
    # stage s > 0 of a chain starts at position first_s + 1 (position 0: the embedding)
    starts = {k: [st.first + 1 for st in _stages(templates[k])[1:]] for k in kinds}
    cuts = sorted({0, num_blocks + 2, *(c for k in kinds for c in starts[k])})
    runs = list(zip(cuts, cuts[1:], strict=False))
    block = lp.block.static_bytes * ratio
    embed = max(lp.embed.static_bytes * ratio - tied.gradient_bytes, 0.0)
    head = lp.head.static_bytes * ratio
    one_run = len(runs) == 1
    grads = _run_gradients(runs, num_blocks, block=block, embed=embed, head=head)
    # the stage holding each run, per active pipeline; then the holders' nodes
    stage_of = {
        k: np.searchsorted(np.array(starts[k], dtype=np.int64), cuts[:-1], side="right")
        for k in kinds
    }
    rows = np.array(active, dtype=np.int64)
    held = np.stack([stage_of[replicas.kind_of[j]] for j in active])  # (pipelines, runs)
    holder_nodes = replicas.node_codes[rows[:, None], held]
    intra = (holder_nodes == holder_nodes[:1]).all(axis=0).tolist()
    num_holders = len(active)
    tied_s = 0.0
    if tied.gradient_bytes and one_run:
        grads[0] += tied.gradient_bytes  # the same holders: one all-reduce
    ring = [
        ring_allreduce_s(
            num_holders,
            int(grad),
            links.slowest_within if same else links.slowest_card,
        )
        for grad, same in zip(grads, intra, strict=True)
    ]
    if tied.gradient_bytes and not one_run:
        tied_s = _tied_sync_s(replicas, templates, active, tied=tied, links=links)
    slowest = 0.0
    for k in kinds:
        chain = _stages(templates[k])
        by_stage = stage_of[k].tolist()
        for s in range(len(chain)):
            paid = 0.0
            for i, holder in enumerate(by_stage):
                if holder == s:
                    paid += ring[i]
            if tied_s and (s == 0 or s == len(chain) - 1):
                paid += tied_s
            slowest = max(slowest, paid)
    return slowest


def _run_gradients(
    runs: Sequence[tuple[int, int]], num_blocks: int, *, block: float, embed: float, head: float
) -> list[float]:
    """Each run's gradient bytes, summed in the order the per-pipeline function meets its
    pieces (blocks, then the embedding, then the head), so the sums are equal float for
    float."""
    grads = []
    for lo, hi in runs:
        grad = 0.0
        for _ in range(max(lo, 1), min(hi, num_blocks + 1)):  # its blocks
            grad += block
        if lo == 0:
            grad += embed
        if hi == num_blocks + 2:
            grad += head
        grads.append(grad)
    return grads


def _tied_sync_s(
    replicas: Replicas,
    templates: Sequence[Chain | None],
    active: Sequence[int],
    *,
    tied: Tied,
    links: Links,
) -> float:
    """The tied embedding's all-reduce between every active pipeline's first and last
    stage, where those are not the only holders of one run."""
    lengths = [len(_stages(templates[replicas.kind_of[j]])) for j in active]
    ends = [replicas.node_codes[j, 0] for j in active] + [
        replicas.node_codes[j, p - 1] for j, p in zip(active, lengths, strict=True) if p > 1
    ]
    same = len(set(ends)) == 1
    return ring_allreduce_s(
        len(ends), tied.gradient_bytes, links.slowest_within if same else links.slowest_card
    )


def _stages(template: Chain | None) -> tuple[Stage, ...]:
    assert template is not None
    return template.stages


def bind(template: Chain, group: Group) -> Chain:
    """``template``'s partition on the devices of ``group`` (a pipeline of its kind)."""
    stages = tuple(
        Stage(
            device=d,
            first=st.first,
            last=st.last,
            time_s=st.time_s,
            peak_bytes=st.peak_bytes,
            recompute=st.recompute,
        )
        for st, d in zip(template.stages, group, strict=True)
    )
    return Chain(stages=stages, micro_batch=template.micro_batch)
