"""The scheduling policies: invariants, fifo's queue, what fair and goodput decide, and why."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler.cost.profile import analytic_profile
from scheduler.hardware.cluster import Cluster, parse_cluster
from scheduler.models.presets import get_preset
from scheduler.planning.dp import plan_dp
from scheduler.policy.configs import ClusterClasses
from scheduler.policy.decide import decide
from scheduler.policy.rates import PlannedRates
from scheduler.policy.types import POLICIES, JobDemand, PolicyError, PolicySettings

MODELS = ["gpt2-small", "gpt2-medium", "gpt2-xl"]


def cluster_of(*nodes: list[tuple[str, int]], name: str = "test") -> Cluster:
    return parse_cluster(
        {
            "name": name,
            "nodes": [
                {"name": f"n{i}", "devices": [{"type": t, "count": c} for t, c in node]}
                for i, node in enumerate(nodes)
            ],
        }
    )


MIXED = cluster_of(
    [("A100-40GB", 4)],
    [("T4-16GB", 4)],
    [("RTX2080TI-11GB", 4)],
    [("A100-40GB", 2), ("T4-16GB", 2)],
)


def job(name: str, **kwargs: object) -> JobDemand:
    fields: dict[str, object] = {"model": "gpt2-small", "global_batch": 64, "steps_left": 1000}
    fields.update(kwargs)
    return JobDemand(name=name, **fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("devices", "model", "batch"),
    [
        ([("A100-40GB", 3), ("T4-16GB", 2)], "gpt2-small", 64),
        ([("A100-40GB", 1), ("RTX2080TI-11GB", 5)], "gpt2-medium", 37),
        ([("T4-16GB", 8)], "gpt2-small", 5),
        ([("A100-40GB", 2), ("T4-16GB", 2)], "gpt2-xl", 16),
    ],
)
def test_class_rate_is_the_planners_prediction(
    devices: list[tuple[str, int]], model: str, batch: int
) -> None:
    cluster = cluster_of(devices)
    classes = ClusterClasses.of(cluster)
    planned = plan_dp(analytic_profile(cluster, get_preset(model)), batch).predicted_samples_per_s
    rate = PlannedRates.for_cluster(cluster)(
        model=model, global_batch=batch, config=classes.config_of(cluster.ids)
    )
    assert rate == pytest.approx(planned, rel=1e-9)


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[Cluster, list[JobDemand]]:
    types = ["A100-40GB", "T4-16GB", "RTX2080TI-11GB"]
    nodes = [
        [(draw(st.sampled_from(types)), draw(st.integers(1, 4)))]
        for _ in range(draw(st.integers(1, 3)))
    ]
    cluster = cluster_of(*nodes)
    free = list(cluster.ids)
    jobs = []
    for i in range(draw(st.integers(1, 7))):
        lo = draw(st.integers(1, 3))
        hi = draw(st.one_of(st.none(), st.integers(lo, 8)))
        held: tuple[str, ...] = ()
        if free and draw(st.booleans()):
            n = draw(st.integers(lo, max(lo, min(len(free), hi or 8))))
            if n <= len(free):
                held, free = tuple(free[:n]), free[n:]
        jobs.append(
            job(
                f"j{i}",
                model=draw(st.sampled_from(MODELS)),
                global_batch=draw(st.sampled_from([1, 8, 64, 256])),
                steps_left=draw(st.floats(1, 1e5)),
                priority=draw(st.sampled_from([0.5, 1.0, 3.0])),
                min_devices=lo,
                max_devices=hi,
                held=held,
                arrival_s=float(i),
                waiting_s=0.0 if held else draw(st.sampled_from([0.0, 100.0, 1e6])),
            )
        )
    return cluster, jobs


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenario=scenarios(), policy=st.sampled_from(POLICIES))
def test_no_device_twice_and_every_job_within_its_bounds(
    scenario: tuple[Cluster, list[JobDemand]], policy: str
) -> None:
    cluster, jobs = scenario
    allocation = decide(cluster, jobs, policy=policy)
    seen: set[str] = set()
    for j in jobs:
        ids = allocation.devices[j.name]
        assert not seen & set(ids), f"{policy} gave a device to two jobs"
        seen.update(ids)
        assert set(ids) <= set(cluster.ids)
        if j.max_devices is not None:
            assert len(ids) <= j.max_devices
        kept_by_fifo = policy == "fifo" and set(ids) == set(j.held)
        if ids and not kept_by_fifo:
            assert len(ids) >= j.min_devices
            assert allocation.samples_per_s[j.name] > 0
        assert allocation.reasons[j.name]


def test_fifo_reserves_for_the_head_of_the_queue() -> None:
    cluster = cluster_of([("A100-40GB", 4)], [("A100-40GB", 4)])
    running = job("running", held=("n0/0", "n0/1", "n0/2", "n0/3"), max_devices=4)
    head = job("head", max_devices=8, arrival_s=1)
    small = job("small", max_devices=2, arrival_s=2)
    allocation = decide(cluster, [running, head, small], policy="fifo")
    assert allocation.devices["running"] == running.held
    assert allocation.devices["head"] == ()
    assert allocation.devices["small"] == (), "the free devices are reserved for the head"
    assert "needs 8 devices, 4 free" in allocation.reasons["head"]


def test_fifo_without_max_devices_takes_every_device_the_model_fits() -> None:
    allocation = decide(MIXED, [job("big", model="gpt2-xl", global_batch=32)], policy="fifo")
    types = {MIXED.device(i).type for i in allocation.devices["big"]}
    assert types == {"A100-40GB"} and len(allocation.devices["big"]) == 6


@pytest.mark.parametrize("policy", ["fair", "goodput"])
def test_shared_policies_run_every_job_that_fits_side_by_side(policy: str) -> None:
    jobs = [
        job("a", max_devices=8),
        job("b", model="gpt2-xl", global_batch=32, max_devices=8),
        job("c", model="gpt2-medium", global_batch=128),
    ]
    allocation = decide(MIXED, jobs, policy=policy)
    assert all(allocation.devices[j.name] for j in jobs)
    xl_types = {MIXED.device(i).type for i in allocation.devices["b"]}
    assert xl_types == {"A100-40GB"}, "gpt2-xl fits only the A100s"
    assert "samples/s" in allocation.reasons["a"]
    assert allocation.solver.startswith(("exact", "heuristic"))


@pytest.mark.parametrize("policy", POLICIES)
def test_a_running_job_keeps_its_devices_when_nothing_changes(policy: str) -> None:
    rates = PlannedRates.for_cluster(MIXED)
    jobs = [job("a", max_devices=4), job("b", model="gpt2-medium", max_devices=6)]
    first = decide(MIXED, jobs, policy=policy, rates=rates)
    again = [replace(j, steps_left=j.steps_left * 0.99, held=first.devices[j.name]) for j in jobs]
    second = decide(MIXED, again, policy=policy, rates=rates)
    assert second.devices == first.devices
    assert all("kept its devices" in r or "keeps" in r for r in second.reasons.values())


@pytest.mark.parametrize("policy", POLICIES)
def test_a_job_below_its_minimum_waits(policy: str) -> None:
    cluster = cluster_of([("T4-16GB", 4)])
    running = job("running", held=("n0/0", "n0/1", "n0/2"), max_devices=3, min_devices=3)
    waiting = job("waiting", min_devices=2, max_devices=2, arrival_s=1)
    allocation = decide(cluster, [running, waiting], policy=policy)
    assert allocation.devices["waiting"] == ()
    assert allocation.reasons["waiting"].startswith("waits")


@pytest.mark.parametrize("policy", POLICIES)
def test_allowed_device_types_are_respected(policy: str) -> None:
    picky = job("picky", device_types=("t4-16gb",), max_devices=3)
    allocation = decide(MIXED, [picky], policy=policy)
    assert allocation.devices["picky"]
    assert {MIXED.device(i).type for i in allocation.devices["picky"]} == {"T4-16GB"}


def test_goodput_lets_a_starving_job_go_first() -> None:
    cluster = cluster_of([("A100-40GB", 2)])
    holder = job("holder", held=("n0/0",), max_devices=1, min_devices=1)
    short = job("short", steps_left=10, max_devices=1, min_devices=1, waiting_s=10)
    # About 2 h long, so 5 h of waiting is past both bounds.
    starving = job("old", steps_left=2000, max_devices=1, waiting_s=5 * 3600)
    allocation = decide(cluster, [holder, short, starving], policy="goodput")
    assert allocation.devices["old"] and not allocation.devices["short"]
    assert allocation.reasons["short"].startswith("waits")


def test_goodput_favours_the_job_closest_to_done() -> None:
    cluster = cluster_of([("A100-40GB", 1)])
    near = job("near", steps_left=10, arrival_s=5)
    far = job("far", steps_left=100_000, arrival_s=0)
    assert decide(cluster, [far, near], policy="goodput").devices["near"]
    assert decide(cluster, [far, near], policy="fair").devices["far"], "fair: arrival order"


def test_a_model_that_fits_nowhere_is_told_so() -> None:
    cluster = cluster_of([("T4-16GB", 2)])
    allocation = decide(cluster, [job("xl", model="gpt2-xl")], policy="goodput")
    assert allocation.devices["xl"] == ()
    assert "fits no device" in allocation.reasons["xl"]


def test_bad_requests_are_one_line_errors() -> None:
    with pytest.raises(
        PolicyError, match="policy: unknown 'lottery'; allowed: fifo, fair, goodput"
    ):
        decide(MIXED, [job("a")], policy="lottery")
    with pytest.raises(PolicyError, match="name 'a' appears twice"):
        decide(MIXED, [job("a"), job("a")])
    with pytest.raises(PolicyError, match="max_devices 1 is below min_devices 2"):
        job("a", min_devices=2, max_devices=1)


def test_goodput_lets_short_jobs_go_first_and_says_why_the_long_one_waits() -> None:
    """Least average JCT: with one device and three jobs waiting, the short one runs and
    the long one is told why it waits and how long it may; ``throughput`` runs all."""
    cluster = cluster_of([("A100-40GB", 2)])
    jobs = [
        job("long", steps_left=1e6, max_devices=1, arrival_s=0),
        job("short", steps_left=100, max_devices=1, arrival_s=5),
        job("medium", steps_left=1e4, max_devices=1, arrival_s=9),
    ]
    allocation = decide(cluster, jobs, policy="goodput")
    assert allocation.devices["short"] and allocation.devices["medium"]
    assert allocation.devices["long"] == ()
    assert re.fullmatch(
        r"waits: jobs with less remaining time go first; it starts within [\d,]+ h of "
        r"waiting at the latest, as long as it takes to run",
        allocation.reasons["long"],
    ), allocation.reasons["long"]
    fair = decide(cluster, jobs, policy="fair")
    assert fair.devices["long"] and fair.devices["short"], "fair: arrival order"


def test_the_objective_setting_is_checked() -> None:
    with pytest.raises(
        PolicyError, match="settings.objective: unknown 'makespan'; allowed: jct, throughput"
    ):
        PolicySettings(objective="makespan")  # type: ignore[arg-type]


@pytest.mark.parametrize("policy", ["fair", "goodput"])
def test_a_job_short_of_usable_devices_does_not_double_book_anothers(policy: str) -> None:
    # big holds a T4 its model does not fit and two A100s: its minimum of three A100s
    # takes the third, which small holds; small must then run elsewhere, not on it too.
    cluster = cluster_of([("T4-16GB", 1)], [("A100-40GB", 3)])
    big = job("big", model="gpt2-xl", global_batch=1, min_devices=3, held=("n0/0", "n1/0", "n1/1"))
    small = job("small", global_batch=1, held=("n1/2",), arrival_s=3)
    allocation = decide(
        cluster, [big, small, job("new", global_batch=1, arrival_s=4)], policy=policy
    )
    ids = [i for devices in allocation.devices.values() for i in devices]
    assert len(ids) == len(set(ids))
    assert len(allocation.devices["big"]) == 3
    assert allocation.devices["small"] == ("n0/0",)
