"""The cluster simulator: every job finishes, progress follows the planned rates, restarts cost."""

from __future__ import annotations

from dataclasses import replace

import pytest

from scheduler.clustersim.simulator import (
    SimResult,
    SimSettings,
    SimulationError,
    replay_policy,
    simulate,
)
from scheduler.clustersim.trace import TraceJob, generate_trace
from scheduler.hardware.cluster import Cluster, parse_cluster
from scheduler.policy.configs import ClusterClasses
from scheduler.policy.rates import PlannedRates
from scheduler.policy.types import POLICIES, PolicyName, PolicySettings


def small_mixed() -> Cluster:
    return parse_cluster(
        {
            "name": "small-mixed",
            "nodes": [
                {"name": "a", "devices": [{"type": "A100-40GB", "count": 4}]},
                {"name": "t", "devices": [{"type": "T4-16GB", "count": 4}]},
                {"name": "r", "devices": [{"type": "RTX2080TI-11GB", "count": 4}]},
            ],
        }
    )


def homogeneous() -> Cluster:
    return parse_cluster(
        {
            "name": "a100-8",
            "nodes": [
                {"name": f"n{i}", "devices": [{"type": "A100-40GB", "count": 4}]} for i in range(2)
            ],
        }
    )


def short_trace(num_jobs: int, seed: int) -> list[TraceJob]:
    """A generated trace cut to minutes of work so the test replays in seconds."""
    return [
        replace(j, steps=max(1, j.steps // 20))
        for j in generate_trace(num_jobs, jobs_per_hour=40, seed=seed)
    ]


@pytest.fixture(scope="module")
def results() -> dict[PolicyName, SimResult]:
    cluster = small_mixed()
    rates = PlannedRates.for_cluster(cluster)
    trace = short_trace(14, seed=3)
    return {p: simulate(cluster, trace, policy=p, rates=rates) for p in POLICIES}


def test_every_job_finishes_under_every_policy(results: dict[PolicyName, SimResult]) -> None:
    names = {j.name for j in short_trace(14, seed=3)}
    for policy, result in results.items():
        assert {j.name for j in result.jobs} == names, policy
        for j in result.jobs:
            assert j.arrival_s <= j.start_s <= j.end_s
            assert j.allocations and j.allocations[0].devices
        assert result.makespan_s >= max(j.jct_s for j in result.jobs) - 1e-6
        assert 0 < result.utilization <= 1


def test_progress_integrates_the_planned_rates(results: dict[PolicyName, SimResult]) -> None:
    trace = {j.name: j for j in short_trace(14, seed=3)}
    for result in results.values():
        for j in result.jobs:
            done = 0.0
            spans = [*j.allocations[1:], None]
            for a, following in zip(j.allocations, spans, strict=True):
                until = following.t_s if following is not None else j.end_s
                done += a.samples_per_s * max(0.0, until - a.resume_s)
            want = trace[j.name].steps * trace[j.name].global_batch
            assert done == pytest.approx(want, rel=1e-6), (result.policy, j.name)


def test_a_move_costs_the_reallocation_delay(results: dict[PolicyName, SimResult]) -> None:
    later = [a for r in results.values() for j in r.jobs for a in j.allocations[1:] if a.devices]
    assert later, "the trace should make some policy move a job"
    for a in later:
        assert a.resume_s == pytest.approx(a.t_s + SimSettings().reallocation_s)
    assert all(r.num_reallocations == 0 for r in results.values() if r.policy == "fifo")


def test_a_jobs_own_restart_cost_and_device_types_are_honoured() -> None:
    """A trace row's ``restart_s`` replaces the replay-wide restart charge, and its
    ``device_types`` keep it off every other type, under every policy."""
    cluster = small_mixed()
    rates = PlannedRates.for_cluster(cluster)
    trace = [
        replace(j, restart_s=7.0, device_types=("T4-16GB", "RTX2080TI-11GB"))
        for j in short_trace(10, seed=3)
        if j.model in ("gpt2-small", "gpt2-medium")  # what fits a T4 or a 2080 Ti
    ]
    for policy in POLICIES:
        result = simulate(cluster, trace, policy=policy, rates=rates)
        assert len(result.jobs) == len(trace)
        for j in result.jobs:
            for a in j.allocations:
                assert all(not d.startswith("a/") for d in a.devices), (policy, j.name)
            for a in j.allocations[1:]:
                if a.devices:
                    assert a.resume_s == pytest.approx(a.t_s + 7.0), (policy, j.name)


def test_goodput_is_no_worse_than_fair_on_a_homogeneous_cluster() -> None:
    cluster = homogeneous()
    rates = PlannedRates.for_cluster(cluster)
    trace = short_trace(16, seed=5)
    fair = simulate(cluster, trace, policy="fair", rates=rates)
    goodput = simulate(cluster, trace, policy="goodput", rates=rates)
    assert goodput.avg_jct_s <= fair.avg_jct_s


def test_a_job_that_fits_nowhere_is_an_error_naming_it() -> None:
    cluster = parse_cluster(
        {"name": "t4s", "nodes": [{"name": "n", "devices": [{"type": "T4-16GB"}]}]}
    )
    trace = [TraceJob(name="huge", arrival_s=0, model="gpt2-xl", global_batch=8, steps=10)]
    with pytest.raises(SimulationError, match="trace job 'huge': model gpt2-xl fits no device"):
        simulate(cluster, trace, policy="goodput")


def test_device_types_the_cluster_lacks_name_what_it_has() -> None:
    """A restriction to types the cluster has none of is not the model's fault: the error
    says which types the cluster does have."""
    cluster = parse_cluster(
        {"name": "t4s", "nodes": [{"name": "n", "devices": [{"type": "T4-16GB"}]}]}
    )
    trace = [
        TraceJob(
            name="a100s",
            arrival_s=0,
            model="gpt2-small",
            global_batch=8,
            steps=10,
            device_types=("A100-80GB",),
        )
    ]
    with pytest.raises(
        SimulationError,
        match="trace job 'a100s': device_types A100-80GB: t4s has none; it has T4-16GB",
    ):
        simulate(cluster, trace, policy="goodput")


def test_min_devices_above_the_cluster_is_an_error() -> None:
    trace = [
        TraceJob(
            name="wide", arrival_s=0, model="gpt2-small", global_batch=8, steps=10, min_devices=9
        )
    ]
    with pytest.raises(SimulationError, match="min_devices 9 but only 8 devices"):
        simulate(homogeneous(), trace, policy="fifo")


def test_bad_settings_name_the_field() -> None:
    with pytest.raises(SimulationError, match="round_s: must be a number > 0, got 0"):
        SimSettings(round_s=0)


def test_a_job_split_across_nodes_is_put_back_together_when_room_frees() -> None:
    """Three jobs on two 4-GPU nodes: ``c`` arrives when only two devices on each node
    are free and runs split; once ``a`` ends, its node has room for all of ``c``, which
    moves there and runs at its one-node rate instead of staying split for good."""
    cluster = parse_cluster(
        {
            "name": "v100x2",
            "nodes": [
                {"name": f"n{i}", "devices": [{"type": "V100-16GB", "count": 4}]} for i in range(2)
            ],
        }
    )
    trace = [
        TraceJob(
            name="a", arrival_s=0, model="gpt2-small", global_batch=64, steps=2000, max_devices=2
        ),
        TraceJob(
            name="b", arrival_s=0, model="gpt2-small", global_batch=64, steps=20000, max_devices=3
        ),
        TraceJob(
            name="c",
            arrival_s=600,
            model="gpt2-small",
            global_batch=64,
            steps=20000,
            min_devices=4,
            max_devices=4,
        ),
    ]
    rates = PlannedRates.for_cluster(cluster)
    for policy in ("fair", "goodput"):
        jobs = {j.name: j for j in simulate(cluster, trace, policy=policy, rates=rates).jobs}
        first, last = jobs["c"].allocations[0], jobs["c"].allocations[-1]
        nodes = {d.split("/")[0] for d in first.devices}
        assert len(nodes) == 2, f"{policy}: the reproduction no longer splits c: {first.devices}"
        assert last.t_s == jobs["a"].end_s, f"{policy}: c moved at {last.t_s}, not when a ended"
        assert {d.split("/")[0] for d in last.devices} == {"n1"}, (policy, last.devices)
        assert last.samples_per_s > first.samples_per_s
        # b, which shrank to make room for c, grows back next to its own devices.
        assert {d.split("/")[0] for d in jobs["b"].allocations[-1].devices} == {"n0"}


def test_short_jobs_go_first_yet_a_long_one_never_waits_past_the_bound() -> None:
    """One A100, a 90-minute job just after a 10-minute one, then a 10-minute job every
    8 minutes: ``goodput`` keeps running the short jobs first (least average JCT) and,
    without aging, the long one waits until its bound, the longer of ``max_wait_s`` (one
    hour here) and its own run time (90 minutes: bounded slowdown), and then starts as
    soon as the short job running at that moment ends."""
    cluster = parse_cluster(
        {"name": "one", "nodes": [{"name": "n", "devices": [{"type": "A100-40GB"}]}]}
    )
    rates = PlannedRates.for_cluster(cluster)
    one = ClusterClasses.of(cluster).config_of(cluster.ids)
    steps_per_s = rates(model="gpt2-small", global_batch=64, config=one) / 64

    def at(name: str, arrival_s: float, seconds: float) -> TraceJob:
        return TraceJob(
            name=name,
            arrival_s=arrival_s,
            model="gpt2-small",
            global_batch=64,
            steps=round(seconds * steps_per_s),
        )

    trace = [at("long", 1, 5400)] + [at(f"s{i:02d}", 480 * i, 600) for i in range(16)]
    settings = SimSettings(policy=replay_policy(aging_s=0, max_wait_s=3600))
    goodput = simulate(cluster, trace, policy="goodput", rates=rates, settings=settings)
    fifo = simulate(cluster, trace, policy="fifo", rates=rates, settings=settings)
    long = next(j for j in goodput.jobs if j.name == "long")
    assert 5400 <= long.start_s <= 1 + 5400 + 600 + settings.round_s
    assert goodput.avg_jct_s < 0.8 * fifo.avg_jct_s


def test_a_replay_decides_as_the_service_but_stops_its_searches_at_their_node_limit() -> None:
    """The service's 0.5 s solver limit binds at a point that depends on the machine's
    load; a replay's is ten times longer, so the node limit stops its searches and the
    same trace gives the same JCTs on any machine. Everything else is the service's."""
    replay, service = SimSettings().policy, PolicySettings()
    assert replay.solver_time_limit_s >= 10 * service.solver_time_limit_s
    assert replace(replay, solver_time_limit_s=service.solver_time_limit_s) == service
