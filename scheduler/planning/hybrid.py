"""Hybrid plans (``hybrid``): several uneven pipelines side by side, data-parallel across them.

Each pipeline is partitioned as in :mod:`scheduler.planning.stages`; pipelines get
uneven micro-batch counts, as Oobleck (Jang et al., SOSP 2023) gives heterogeneous
pipeline templates different shares (:func:`allocate`).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from scheduler.cost.costmodel import ceil_div, ring_allreduce_s
from scheduler.cost.profile import DeviceProfile, Profile
from scheduler.errors import PlanError
from scheduler.planning.bounds import (
    single_pipeline_lower_bound,
    step_lower_bounds,
)
from scheduler.planning.pipeline import (
    LARGER_MICRO_BATCH_MARGIN,
    StageBusy,
    TimedChoice,
    best_pipeline,
    exclusion_reason,
    layer_usable,
    micro_batch_candidates,
    no_fit_message,
    prefer_larger_micro_batches,
    stage_plans,
)
from scheduler.planning.plan import DevicePlan, Excluded, Plan, check_global_batch
from scheduler.planning.replicas import Replicas, bind
from scheduler.planning.replicas import allocate as allocate_replicas
from scheduler.planning.replicas import boundary_s as replica_boundary_s
from scheduler.planning.replicas import sync_s as replica_sync_s
from scheduler.planning.stages import (
    Chain,
    StageCache,
    Tied,
    fits,
    in_flight_1f1b,
    layers_of,
    partition,
    tied_embedding,
)

Group = tuple[DeviceProfile, ...]


def pipeline_order(devices: Sequence[DeviceProfile]) -> Group:
    """Stage order inside a pipeline: by node, then memory descending (pipeline.py, order 2)."""
    node_memory: dict[str, int] = {}
    for d in devices:
        node_memory[d.node] = node_memory.get(d.node, 0) + d.capacity_bytes
    return tuple(
        sorted(devices, key=lambda d: (-node_memory[d.node], d.node, -d.capacity_bytes, d.id))
    )


class Partitioner:
    """Memoised :func:`partition` of pipelines, keyed by their devices' figures."""

    def __init__(self, tied: Tied) -> None:
        self.tied = tied
        self._cache: dict[tuple[int, ...], Chain | None] = {}
        self._figures: dict[tuple[int, object], int] = {}
        self._stage_cache = StageCache()
        self._fits: dict[tuple[int, ...], bool] = {}
        self._codes: dict[str, int] = {}
        """Device id -> index of its figures: hashing a device's figures (layers with
        recomputation figures) once per plan rather than once per lookup."""

    def code(self, d: DeviceProfile) -> int:
        """Index of ``d``'s figures: devices of one index partition alike."""
        code = self._codes.get(d.id)
        if code is None:
            code = self._figures.setdefault((d.capacity_bytes, d.layers), len(self._figures))
            self._codes[d.id] = code
        return code

    def template(self, group: Group, micro_batch: int) -> Chain | None:
        """The partition of pipelines like ``group`` (its stages' devices may be another
        such pipeline's: only their figures count)."""
        key = (micro_batch, *(self.code(d) for d in group))
        if key not in self._cache:
            self._cache[key] = partition(
                group,
                micro_batch=micro_batch,
                in_flight=in_flight_1f1b(len(group), None),
                tied_state_bytes=self.tied.state_bytes,
                cache=self._stage_cache,
            )
        return self._cache[key]

    def __call__(self, group: Group, micro_batch: int) -> Chain | None:
        """The partition of ``group`` on its own devices."""
        template = self.template(group, micro_batch)
        return None if template is None else bind(template, group)

    def fits(self, group: Group) -> bool:
        """Whether one micro-batch of one sample fits a pipeline of ``group``."""
        key = tuple(map(self.code, group))
        found = self._fits.get(key)
        if found is None:
            found = self._fits[key] = fits(
                group,
                micro_batch=1,
                in_flight=in_flight_1f1b(len(group), None),
                tied_state_bytes=self.tied.state_bytes,
                cache=self._stage_cache,
            )
        return found


def _chain_until_fit(
    units: Iterable[Sequence[DeviceProfile]], fits: Partitioner
) -> tuple[list[Group], list[DeviceProfile]]:
    """Cut ``units`` (in order; a unit is one device or a whole node) into consecutive
    pipelines, each of as few units as fits; the devices left over that fit no pipeline."""
    groups: list[Group] = []
    current: list[DeviceProfile] = []
    for unit in units:
        current.extend(unit)
        group = pipeline_order(current)
        if fits.fits(group):
            groups.append(group)
            current = []
    return groups, current


def group_by_node(devices: Sequence[DeviceProfile], fits: Partitioner) -> list[Group]:
    nodes: dict[str, list[DeviceProfile]] = {}
    for d in devices:
        nodes.setdefault(d.node, []).append(d)
    ordered = sorted(nodes.values(), key=lambda ds: -sum(d.capacity_bytes for d in ds))
    groups, current = _chain_until_fit(ordered, fits)
    if current and groups:  # too small alone: lengthen the last pipeline
        merged = pipeline_order([*groups[-1], *current])
        if fits.fits(merged):
            groups[-1] = merged
    return groups


def group_by_type(devices: Sequence[DeviceProfile], fits: Partitioner, stretch: int) -> list[Group]:
    """Pipelines of like devices of one node, ``stretch`` × the shortest length that fits."""
    classes: dict[tuple[str, str, int], list[DeviceProfile]] = {}
    for d in devices:
        classes.setdefault((d.node, d.type, d.capacity_bytes), []).append(d)
    groups: list[Group] = []
    leftovers: list[DeviceProfile] = []
    for members in classes.values():
        shortest = next(
            (q for q in range(1, len(members) + 1) if fits.fits(tuple(members[:q]))), None
        )
        if shortest is None:
            leftovers.extend(members)
            continue
        q = min(len(members), shortest * stretch)
        whole = len(members) // q
        groups += [tuple(members[i * q : (i + 1) * q]) for i in range(whole)]
        leftovers.extend(members[whole * q :])
    leftovers.sort(key=lambda d: (-d.capacity_bytes, d.id))
    more, _ = _chain_until_fit(([d] for d in leftovers), fits)
    return groups + more


@dataclass(frozen=True, kw_only=True, slots=True)
class HybridChoice(TimedChoice):
    grouping: str
    pipelines: tuple[tuple[Chain, Group], ...]
    """Each pipeline's partition (on devices like its own) and its devices, in stage order."""
    counts: tuple[int, ...]
    """Micro-batches per pipeline."""
    samples: tuple[int, ...]

    def chains(self) -> tuple[Chain, ...]:
        """The pipelines partitioned on their own devices (built for the plan kept)."""
        return tuple(bind(template, group) for template, group in self.pipelines)


def allocate(
    chains: Sequence[Chain], pipe_comm_s: Sequence[float], num_micro_batches: int
) -> list[int]:
    """Micro-batches per pipeline minimising the slowest pipeline.

    Each pipeline is partitioned exactly as in :mod:`scheduler.planning.stages` (with the
    conservative 1F1B memory of ``p − s`` micro-batches in flight on stage ``s``,
    valid whatever share it gets, and each stage's recomputation mode chosen
    there). The global batch is cut into ``M`` micro-batches
    of one size ``b`` (as equal as integers allow) and pipelines get *uneven*
    micro-batch counts, as Oobleck (Jang et al., SOSP 2023) gives heterogeneous
    pipeline templates different shares: pipeline ``j`` with ``m_j`` micro-batches
    takes ``Σ_s t_s + (m_j − 1)·max_s t_s`` plus its boundary transfers. Handing
    the ``M`` micro-batches out one by one to the pipeline that would finish
    earliest with it (a heap) minimises the slowest pipeline exactly, because each
    pipeline's time is non-decreasing in its count (the same argument as the
    data-parallel planner's). Pipelines may get none and sit out.
    """
    counts = [0] * len(chains)
    # Chain.compute_s(m) = total + (m − 1)·slowest: both read once per pipeline, not per pop
    total = [c.total_s for c in chains]
    slowest = [c.slowest_s for c in chains]
    heap = [(total[j] + pipe_comm_s[j], j) for j in range(len(chains))]
    heapq.heapify(heap)
    for _ in range(num_micro_batches):
        _, j = heapq.heappop(heap)
        counts[j] += 1
        heapq.heappush(heap, (total[j] + counts[j] * slowest[j] + pipe_comm_s[j], j))
    return counts


def sync_s(chains: Sequence[Chain], profile: Profile, tied: Tied) -> float:
    """Gradient all-reduce among the holders of each piece.

    Gradients: every piece of the model (embedding, each block, head) is held by
    one device per active pipeline; its gradient is SUM-all-reduced among those
    holders. Every pipeline scales its loss by ``global_batch·seq_len`` (DESIGN.md,
    "Correctness"), so each holder's gradient is already weighted by its
    pipeline's share of the batch and the sum is the full-batch gradient: the
    update equals single-device training. Consecutive pieces with the same holders
    form one all-reduce; a device's sync time is the sum of its rings (each over
    the slowest link among its holders), and the step pays the slowest device's.
    """
    lp = layers_of(chains[0].stages[0].device)
    total_static = (
        lp.embed.static_bytes + lp.num_blocks * lp.block.static_bytes + lp.head.static_bytes
    )
    ratio = profile.gradient_bytes / total_static if total_static else 0.0
    # pieces: -1 embedding, 0..L-1 blocks, L head; tied embedding separately
    holders: dict[int, list[DeviceProfile]] = {}
    for chain in chains:
        for s, st in enumerate(chain.stages):
            pieces = list(range(st.first, st.last))
            if s == 0:
                pieces.append(-1)
            if s == len(chain.stages) - 1:
                pieces.append(lp.num_blocks)
            for piece in pieces:
                holders.setdefault(piece, []).append(st.device)
    size = {-1: lp.embed.static_bytes, lp.num_blocks: lp.head.static_bytes}
    segments: dict[tuple[str, ...], float] = {}
    for piece, devs in holders.items():
        key = tuple(sorted(d.id for d in devs))
        grad = size.get(piece, lp.block.static_bytes) * ratio
        if piece == -1:
            grad = max(grad - tied.gradient_bytes, 0.0)
        segments[key] = segments.get(key, 0.0) + grad
    if tied.gradient_bytes:
        both = holders[-1] + holders[lp.num_blocks]
        key = tuple(sorted({d.id for d in both}))
        segments[key] = segments.get(key, 0.0) + tied.gradient_bytes
    nodes = {d.id: d.node for ds in holders.values() for d in ds}
    per_device: dict[str, float] = {}
    for ids, grad in segments.items():
        link = profile.links.between(nodes[i] for i in ids)
        t = ring_allreduce_s(len(ids), int(grad), link)
        for i in ids:
            per_device[i] = per_device.get(i, 0.0) + t
    return max(per_device.values(), default=0.0)


@dataclass(frozen=True, kw_only=True, slots=True)
class _Priced(TimedChoice):
    """One micro-batch size of :func:`evaluate`: each kind's partition (None: it does not
    fit) and each pipeline's micro-batches; device-bound chains only for the plan kept."""

    templates: list[Chain | None]
    counts: list[int]

    @property
    def micro_batch(self) -> int:
        return next(t.micro_batch for t in self.templates if t is not None)

    def choice(self, grouping: str, replicas: Replicas, global_batch: int) -> HybridChoice:
        """The pipelines that have a partition, on their own devices, in order, with
        their micro-batches and samples (micro-batches as equal as integers allow,
        handed out in pipeline order)."""
        kept = [j for j, k in enumerate(replicas.kind_of) if self.templates[k] is not None]
        num_micro = sum(self.counts)
        small, extra = divmod(global_batch, num_micro)
        samples, taken = [], 0
        for j in kept:
            n = self.counts[j]
            samples.append(n * small + max(0, min(taken + n, extra) - taken))
            taken += n
        return HybridChoice(
            grouping=grouping,
            pipelines=tuple(
                (_template(self.templates, replicas.kind_of[j]), replicas.groups[j]) for j in kept
            ),
            counts=tuple(self.counts[j] for j in kept),
            samples=tuple(samples),
            compute_s=self.compute_s,
            comm_s=self.comm_s,
        )


def _template(templates: Sequence[Chain | None], kind: int) -> Chain:
    template = templates[kind]
    if template is None:
        raise PlanError(f"hybrid: pipeline kind {kind} has no partition")
    return template


def evaluate(
    grouping: str,
    groups: Sequence[Group],
    global_batch: int,
    profile: Profile,
    partitioner: Partitioner,
    *,
    bounds: Sequence[float] | None = None,
) -> HybridChoice | None:
    """The best micro-batch size and shares for these pipelines.

    Sizes are tried in order of a lower bound on their step time
    (:mod:`scheduler.planning.bounds`; ``bounds``: already computed, one per
    :func:`micro_batch_candidates` size); once a bound exceeds the fastest step found by
    more than the margin within which a larger micro-batch is preferred, no size left
    can change the choice, and the search stops."""
    sizes = micro_batch_candidates(global_batch)
    if bounds is None:
        bounds = step_lower_bounds(groups, global_batch, sizes, profile.links)
    replicas = Replicas.of(groups, partitioner.code)
    kinds = range(len(replicas.members))
    choices: list[_Priced] = []
    fastest = math.inf
    for bound, size in sorted(zip(bounds, sizes, strict=True)):
        if bound > fastest * (1 + LARGER_MICRO_BATCH_MARGIN):
            break
        num_micro = ceil_div(global_batch, size)
        micro = ceil_div(global_batch, num_micro)
        templates = [partitioner.template(replicas.first(k), micro) for k in kinds]
        if all(t is None for t in templates):
            continue
        comm = [
            0.0 if t is None else replica_boundary_s(t, replicas.same_node[k], profile.links)
            for k, t in enumerate(templates)
        ]
        counts = allocate_replicas(replicas, templates, comm, num_micro)
        # the slowest pipeline, over the distinct (kind, count) of those with micro-batches
        running = {(replicas.kind_of[j], n) for j, n in enumerate(counts) if n > 0}
        compute = max(_template(templates, k).compute_s(n) for k, n in running)
        slowest = max(_template(templates, k).compute_s(n) + comm[k] for k, n in running)
        sync = replica_sync_s(
            replicas,
            templates,
            counts,
            gradient_bytes=profile.gradient_bytes,
            links=profile.links,
            tied=partitioner.tied,
        )
        choices.append(
            _Priced(
                templates=templates,
                counts=counts,
                compute_s=compute,
                comm_s=slowest - compute + sync,
            )
        )
        fastest = min(fastest, choices[-1].step_s)
    best = prefer_larger_micro_batches(choices, lambda c: c.micro_batch)
    return None if best is None else best.choice(grouping, replicas, global_batch)


def _evaluate_variants(
    variants: Sequence[tuple[str, Sequence[Group]]],
    global_batch: int,
    profile: Profile,
    partitioner: Partitioner,
) -> list[HybridChoice]:
    """Each grouping's choice, in the order given, leaving out the groupings that cannot
    be the fastest: tried in order of their least step bound over the micro-batch sizes,
    a grouping whose bound exceeds the fastest step already found is not evaluated (its
    choice would be slower than that one). The fastest of the result is the fastest of
    all groupings, exactly."""
    sizes = micro_batch_candidates(global_batch)
    # step_lower_bounds is looked up at the call: a test swaps in zeros to search unpruned
    bounds = {
        i: step_lower_bounds(groups, global_batch, sizes, profile.links)
        for i, (_, groups) in enumerate(variants)
        if groups
    }
    fastest = math.inf
    chosen: dict[int, HybridChoice] = {}
    for i in sorted(bounds, key=lambda i: min(bounds[i])):
        if min(bounds[i]) > fastest:
            continue
        name, groups = variants[i]
        choice = evaluate(
            name,
            groups,
            global_batch,
            profile,
            partitioner,
            bounds=bounds[i],
        )
        if choice is not None:
            chosen[i] = choice
            fastest = min(fastest, choice.step_s)
    return [chosen[i] for i in sorted(chosen)]


def plan_hybrid(profile: Profile, global_batch: int) -> Plan:
    """Pipelines side by side with uneven shares.

    Grouping devices into pipelines (every variant is planned, the fastest kept):
    ``node`` — one pipeline per node (fast intra-node activation links), nodes
    too small for the model chained with the next smaller ones until they fit;
    ``type`` — devices of one type on one node form pipelines of the shortest
    length that holds the model (and of twice that, fewer bubbles per device vs.
    larger micro-batches), leftovers chained by memory; ``single`` — the best
    single pipeline over all devices (the ``pp`` plan), searched only when a bound
    (:func:`~scheduler.planning.bounds.single_pipeline_lower_bound`) says it could beat
    the fastest grouping. Pipelines of one kind are partitioned, priced and given
    micro-batches once per kind (:mod:`scheduler.planning.replicas`), which keeps a
    4,096-device plan to about half a second.
    """
    check_global_batch(global_batch)
    usable = layer_usable(profile)
    tied = tied_embedding(profile)
    partitioner = Partitioner(tied)
    candidates: list[HybridChoice] = []
    variants: list[tuple[str, list[Group]]] = [
        ("node", group_by_node(usable, partitioner)),
        ("type", group_by_type(usable, partitioner, 1)),
        ("type×2", group_by_type(usable, partitioner, 2)),
    ]
    candidates += _evaluate_variants(variants, global_batch, profile, partitioner)
    # One pipeline over (some of) the devices, unless no single pipeline can beat the
    # fastest grouping (then it could not be chosen: the first fastest candidate wins)
    fastest = min((c.step_s for c in candidates), default=math.inf)
    single = None
    if (
        single_pipeline_lower_bound(usable, global_batch, micro_batch_candidates(global_batch))
        < fastest
    ):
        single = best_pipeline(usable, global_batch, links=profile.links, tied=tied)
    if single is not None:
        candidates.append(
            HybridChoice(
                grouping="single",
                pipelines=((single.chain, tuple(st.device for st in single.chain.stages)),),
                counts=(single.num_micro_batches,),
                samples=(global_batch,),
                compute_s=single.compute_s,
                comm_s=single.comm_s,
            )
        )
    if not candidates:
        raise PlanError(no_fit_message(usable, tied))
    best = min(candidates, key=lambda c: c.step_s)
    return _to_plan(best, profile, usable, tied, global_batch)


def _to_plan(
    best: HybridChoice,
    profile: Profile,
    usable: Sequence[DeviceProfile],
    tied: Tied,
    global_batch: int,
) -> Plan:
    entries: list[DevicePlan] = []
    excluded: list[Excluded] = []
    offset, index = 0, 0
    memo: StageBusy = {}
    chains = best.chains()
    for chain, n, samples in zip(chains, best.counts, best.samples, strict=True):
        if n == 0:
            excluded += [
                Excluded(
                    id=st.device.id,
                    reason="idle: its pipeline gets no "
                    "micro-batch; the others finish sooner without it",
                )
                for st in chain.stages
            ]
            continue
        entries += stage_plans(
            chain, pipeline=index, samples=samples, num_micro_batches=n, offset=offset, memo=memo
        )
        offset += samples
        index += 1
    used = {e.id for e in entries} | {e.id for e in excluded}
    excluded += [
        Excluded(id=d.id, reason="no per-layer figures in the profile")
        for d in profile.devices
        if d.layers is None
    ]
    excluded += [
        Excluded(id=d.id, reason=exclusion_reason(d, tied)) for d in usable if d.id not in used
    ]
    running = [(n, c) for c, n in zip(chains, best.counts, strict=True) if n]
    shares = ", ".join(f"{n}×{c.micro_batch}" for n, c in running)
    if len(running) > 8:
        lengths = sorted({len(c.stages) for _, c in running})
        shares = (
            f"{min(n for n, _ in running)} to {max(n for n, _ in running)} of "
            f"{running[0][1].micro_batch}; pipelines of {lengths} stages"
        )
    notes = (
        f"hybrid: {index} pipeline(s) grouped by {best.grouping}; micro-batches per "
        f"pipeline (count×size) {shares}",
    )
    return best.to_plan("hybrid", global_batch, devices=entries, excluded=excluded, notes=notes)
