"""Simulated devices beside CPU-burning processes: they keep their pace, or say they cannot.

Real busy loops (fresh interpreters) share one core with this test's thread (both
pinned to it, so the contention is the same on a laptop and a 64-core runner),
and are killed at the end of each test. They are started, not forked: a forked
child shares this process's pages copy-on-write, so each page the test then writes
is copied first, which tripled the CPU time of the first paced steps (a cost no
other process on a busy host lays on the devices). A job whose devices cannot keep their pace
(``HETSCHED_PACING_MARGIN=1``: no room for any contention) says so once, on the
module's local Ray and warm pool.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from tests.support import MIXED_CLUSTER, TINY, manual_plan, unit_device
from workers.data.dataset import ByteDataset
from workers.devices.calibration import measure_host
from workers.devices.contention import (
    LAG_TOLERANCE,
    MAX_MARGIN,
    PaceCheck,
    lagging,
    margin_for,
    needed_margin,
    probe_host,
    run_lags,
)
from workers.devices.device import SimulatedDevice
from workers.devices.pacing import Pacing, probe_with_model
from workers.models.gpt import GPT, lm_loss_sum
from workers.profiler import figure_lags
from workers.records import DeviceStep, StepMetrics
from workers.run.pace import HOST_BOUND_STEPS, PaceWatch, host_bound

pytestmark = pytest.mark.skipif(
    not hasattr(os, "sched_setaffinity"), reason="pins processes to one core (Linux)"
)
BURNERS = 2
MICRO_BATCH = 4
STEPS = 4
TRIES = 3
CHANGED_LOAD = 1.6
"""A step whose CPU time is this many times the probe's inflation of the calibration ran
under a load the probe did not see."""


@contextmanager
def burning(num_burners: int, *, core: int | None = None, beside: bool = True) -> Iterator[None]:
    """``num_burners`` busy loops (on ``core``, with this thread when ``beside``, if given),
    killed after."""
    before = os.sched_getaffinity(0)
    if core is not None and beside:
        os.sched_setaffinity(0, {core})
    spin = [sys.executable, "-S", "-c", "while True: pass"]  # a busy loop imports nothing
    burners = [subprocess.Popen(spin) for _ in range(num_burners)]
    try:
        if core is not None:
            for p in burners:
                os.sched_setaffinity(p.pid, {core})
        yield
    finally:
        for p in burners:
            p.kill()
        for p in burners:
            p.wait(timeout=10)
        os.sched_setaffinity(0, before)


def burning_one_core() -> contextlib.AbstractContextManager[None]:
    """This thread and :data:`BURNERS` busy loops on one core."""
    return burning(BURNERS, core=min(os.sched_getaffinity(0)))


def _paced_steps(device: SimulatedDevice, model: GPT) -> list:
    x, y = ByteDataset(None, seq_len=TINY.seq_len).device_batch(
        seed=0, step=0, global_batch=MICRO_BATCH, offset=0, samples=MICRO_BATCH
    )
    return [
        device.run_micro_batch(lambda: lm_loss_sum(model(x), y), model=model, micro_batch=4)
        for _ in range(STEPS)
    ]


@pytest.fixture(scope="module")
def host_cost():
    """gpt-tiny's forward+backward cost on this host, in CPU time (the pacing's base), at
    the probe's micro-batch and the devices'."""
    import torch

    torch.set_num_threads(1)
    return measure_host(TINY, sizes=(1, MICRO_BATCH), repeats=2)


def test_the_live_probe_counts_the_burners_and_raises_the_margin() -> None:
    with burning_one_core():
        load = probe_host()
    assert load.num_cpus == 1
    assert load.cpu_share < 0.5  # two busy loops took at least two thirds of the core
    assert load.others >= BURNERS - 0.5
    assert margin_for(1, load.num_cpus, load.others) >= 6.0 > margin_for(1, 1)


def test_a_paced_device_keeps_its_pace_beside_cpu_burners(host_cost) -> None:
    """The margin raised from the contention measured live keeps every step within the
    tolerance of its GPU's time, although the compute's wall time is several times its
    CPU time, and its CPU time more than the calibration's (the probe measures both)."""
    model = GPT(TINY, seed=0)
    calibrated = host_cost.time_s(MICRO_BATCH)
    for _ in range(TRIES):
        with burning_one_core():
            load = probe_with_model(TINY, host_cost)
            need = needed_margin(1, load.num_cpus, load.others, cpu_inflation=load.cpu_inflation)
            if need > MAX_MARGIN:  # other processes crowd the core too: not what this asks
                pytest.skip(f"host busier than the burners: margin {need:.1f} needed, {load}")
            margin = margin_for(1, load.num_cpus, load.others, cpu_inflation=load.cpu_inflation)
            pacing = Pacing(margin=margin, speed_ratio=1.0, host=host_cost)
            device = SimulatedDevice(device_id="a/0", capacity_bytes=2**40, pacing=pacing)
            steps = _paced_steps(device, model)
        inflation = max(u.cpu_s for u in steps[1:]) / calibrated
        if inflation <= CHANGED_LOAD * load.cpu_inflation:  # the probe's is >= 1
            break
        # Some other process (another test worker) joined the core after the probe: the
        # margin answered the load it measured, not this one. Probe again.
    else:
        pytest.skip(f"the host's load kept changing after each probe (CPU x{inflation:.1f})")
    target = pacing.target_s(MICRO_BATCH)
    for usage in steps[1:]:  # the first warms up
        assert target * 0.99 <= usage.busy_s <= (1 + LAG_TOLERANCE) * target, (
            f"busy {usage.busy_s:.3f} s, paced {target:.3f} s at margin {pacing.margin}; "
            f"compute {usage.compute_s:.3f} s, CPU {usage.cpu_s:.3f} s, calibrated "
            f"{host_cost.time_s(MICRO_BATCH):.3f} s; probe {load.to_dict()}"
        )
        assert usage.cpu_s < 0.8 * usage.compute_s  # it was contended all the same
    assert run_lags("dp", [("a/0", steps[-1].busy_s, target)]) == []


def test_an_overloaded_host_is_reported_in_one_line(host_cost) -> None:
    """With no margin to spare, the burners stretch the compute past the GPU's time: the
    device says it overran, its CPU time shows the starvation, and the check's one line
    names the device and how far behind it was."""
    model = GPT(TINY, seed=0)
    pacing = Pacing(margin=1.0, speed_ratio=1.0, host=host_cost)
    device = SimulatedDevice(device_id="a/0", capacity_bytes=2**40, pacing=pacing)
    with burning_one_core():
        load = probe_host()
        steps = _paced_steps(device, model)
    usage = steps[-1]
    target = pacing.target_s(MICRO_BATCH)
    assert usage.overran
    assert usage.cpu_s < 0.6 * usage.compute_s
    assert lagging(usage.busy_s, target)
    check = PaceCheck(
        margin=1.0, load=load, lags=tuple(run_lags("dp", [("a/0", usage.busy_s, target)]))
    )
    assert not check.keeps_pace and check.untrusted("dp") and not check.untrusted("even")
    line = check.warning()
    assert line is not None and "\n" not in line
    assert line.startswith("host too busy (")
    assert f"a/0 took {usage.busy_s / target:.1f}x its paced" in line
    assert check.to_dict()["keeps_pace"] is False


def test_a_profile_slower_than_its_pacing_is_the_hosts(host_cost) -> None:
    """The profiler's check: figures on their pacing are the GPU's; 1.5x over are not
    (and are not cached: the next profile measures again)."""
    pacing = Pacing(margin=4.0, speed_ratio=2.0, host=host_cost)
    paced = {"fixed_s": 8 * host_cost.fixed_s, "per_sample_s": 8 * host_cost.per_sample_s}
    assert figure_lags("a/1", paced | {"max_micro_batch": 5}, pacing) == []
    slow = {k: 1.5 * v for k, v in paced.items()} | {"max_micro_batch": 5}
    (lag,) = figure_lags("a/1", slow, pacing)
    assert (lag.where, lag.paced_s) == ("profile", pytest.approx(pacing.target_s(4)))
    assert lag.ratio == pytest.approx(1.5)
    check = PaceCheck(margin=4.0, load=None, lags=(lag,))
    assert check.untrusted("dp") and check.untrusted("even")  # every run planned from it


def test_the_simulate_table_marks_host_bound_figures_instead_of_comparing_them() -> None:
    from api.commands.simulate import render

    def run(strategy: str, trusted: bool) -> dict:
        device = {"id": "box/0", "busy_s": 0.4, "wait_s": 0.0, "peak_bytes": 1000}
        plan_device = {"id": "box/0", "samples": 8, "micro_batch": 8, "accum_steps": 1,
                       "busy_s": 0.1}  # fmt: skip
        return {"strategy": strategy, "plan": {"strategy": strategy, "devices": [plan_device]},
                "predicted_step_s": 0.1, "measured_step_s": 0.4, "measured_samples_per_s": 20.0,
                "losses": [5.0, 4.0], "val_losses": [None, None], "devices": [device],
                "recoveries": [], "replans": [], "trusted": trusted}  # fmt: skip

    warning = "host too busy (3.0 other CPU-bound processes on 2 cores): ..."
    doc = {"cluster": "box", "model": "gpt-tiny", "global_batch": 8, "steps": 2, "seed": 0,
           "ideal_samples_per_s": 100.0, "speedup_vs_even": 1.0,
           "runs": [run("dp", False), run("even", False)],
           "host": {"keeps_pace": False, "warning": warning}}  # fmt: skip
    lines = render(doc).splitlines()
    assert [line for line in lines if "host too busy" in line] == [f"warning: {warning}"]
    dp_row = next(line for line in lines if line.startswith("dp "))
    assert dp_row.count("host-bound") == 2 and "+300%" not in dp_row and "20%" not in dp_row
    assert "dp is not compared with even: host-bound (see the warning)" in lines
    quiet = doc | {"runs": [run("dp", True), run("even", True)], "host": {"warning": None}}
    assert "warning" not in render(quiet) and "host-bound" not in render(quiet)


@contextmanager
def pinned(pid: int, core: int) -> Iterator[None]:
    """Every thread of process ``pid`` on ``core``, back where it was after."""
    tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    before = {tid: os.sched_getaffinity(tid) for tid in tids}
    for tid in tids:
        os.sched_setaffinity(tid, {core})
    try:
        yield
    finally:
        for tid, cores in before.items():
            with contextlib.suppress(ProcessLookupError):
                os.sched_setaffinity(tid, cores)


SPLITS = {
    "dp": manual_plan([("a/0", 4, 4), ("a/2", 2, 2)]),
    "fsdp": manual_plan([("a/0", 4, 4, 0.6), ("a/2", 2, 2, 0.4)], strategy="fsdp"),
}
"""The A100 and the L4 of the module's pool, uneven; fully sharded, every pass waits in
its all-gathers for the slower rank, which the pace check must not count as compute."""


def _job(cache_dir, pool, steps: int, watch=None, *, strategy: str = "dp"):
    """gpt-tiny on the A100 and the L4 of the module's pool, every hook recorded."""
    from workers.session import Recorder, TrainJob, train

    hooks = Recorder(watch)
    plan = SPLITS[strategy]
    job = TrainJob(cluster=MIXED_CLUSTER, model=TINY, steps=steps, seed=0, cache_dir=cache_dir)
    train(job, plan, pool=pool, hooks=hooks)
    return hooks


@pytest.mark.parametrize("strategy", sorted(SPLITS))
def test_a_job_whose_host_cannot_keep_its_gpus_pace_says_so_once(
    cache_dir, mixed_pool, monkeypatch, strategy
) -> None:
    """At margin 1 the A100's paced time is the host's bare compute; from step 1 its worker
    shares a core with two busy loops, so it cannot meet it: every step marks it, and
    after HOST_BOUND_STEPS in a row the job says so in one line, once, naming it."""
    monkeypatch.setenv("HETSCHED_PACING_MARGIN", "1")
    core = min(os.sched_getaffinity(0))
    with contextlib.ExitStack() as stack:

        def crowd_the_a100(metrics: StepMetrics) -> None:
            if metrics.step == 0:  # its worker exists now
                stack.enter_context(pinned(mixed_pool.pids()["a/0"], core))
                stack.enter_context(burning(BURNERS, core=core, beside=False))

        hooks = _job(
            cache_dir,
            mixed_pool,
            steps=HOST_BOUND_STEPS + 1,
            watch=crowd_the_a100,
            strategy=strategy,
        )
    (notice,) = hooks.host_bound
    streak = hooks.steps[notice.step - HOST_BOUND_STEPS + 1 : notice.step + 1]
    assert len(streak) == HOST_BOUND_STEPS
    assert all(m.devices[0].id == "a/0" and host_bound(m.devices[0]) for m in streak)
    assert "a/0" in dict(notice.lags)
    line = notice.message()
    assert "\n" not in line and line.startswith("host-bound: this host cannot keep ")
    assert line.endswith("speeds of this job are not those of its GPUs")
    assert notice.to_dict()["devices"][0]["compute_ratio"] > 1 + LAG_TOLERANCE
    assert hooks.steps[-1].devices[0].to_dict()["compute_ratio"] > 1 + LAG_TOLERANCE  # JSON


@pytest.mark.parametrize("strategy", sorted(SPLITS))
def test_a_job_on_a_normal_margin_keeps_pace_and_says_nothing(
    cache_dir, mixed_pool, monkeypatch, strategy
) -> None:
    """The margin from the live contention leaves every device's compute inside its pacing:
    each step measures it (a ratio on every simulated device; fully sharded, less the
    ranks' time in collectives, where the A100 waits for the L4), and nothing is said."""
    monkeypatch.delenv("HETSCHED_PACING_MARGIN", raising=False)
    hooks = _job(cache_dir, mixed_pool, steps=HOST_BOUND_STEPS + 1, strategy=strategy)
    assert hooks.host_bound == []
    ratios = [d.compute_ratio for m in hooks.steps[1:] for d in m.devices]
    assert all(r is not None and r > 0 for r in ratios), ratios
    # One pass may still lag when the rest of the machine gets busy mid-job (the suite's
    # other process, a laptop's browser): the product's rule, which host_bound applies, is
    # a lag on HOST_BOUND_STEPS steps in a row. Keeping pace is the typical pass inside it.
    assert statistics.median(r for r in ratios if r is not None) <= 1 + LAG_TOLERANCE, ratios


def test_a_sharded_ranks_time_in_collectives_is_not_its_compute(monkeypatch) -> None:
    """A fully-sharded rank's compute ratio leaves out its passes' time in collectives:
    0.5 s of compute, 0.3 s of it blocked on an all-gather, against a 0.1 s paced
    micro-batch is 2x its pace, not the 5x its raw compute reads."""
    from types import SimpleNamespace

    from workers.devices.calibration import HostCalibration
    from workers.devices.device import StepUsage
    from workers.runtime import shards
    from workers.runtime.fsdp import FullyShardedEngine

    clock = [0.0]
    monkeypatch.setattr(shards, "time", SimpleNamespace(perf_counter=lambda: clock[0]))

    class Handle:  # a collective whose peers arrive 0.3 s after this rank awaits it
        def wait(self) -> None:
            clock[0] += 0.3

    comm = shards.ShardComm(gather_group=None, reduce_group=None, padded=False)
    shards.Pending(work=Handle(), comm=comm).wait()
    assert comm.collective_s == pytest.approx(0.3)
    engine = object.__new__(FullyShardedEngine)  # no process group: the arithmetic alone
    host = HostCalibration(fixed_s=0.1, per_sample_s=0.0)
    pacing = Pacing(margin=1.0, speed_ratio=1.0, host=host)
    engine.device = SimulatedDevice(device_id="a/0", capacity_bytes=2**40, pacing=pacing)
    engine.sizes, engine.pass_collective_s = [4], comm.collective_s
    usage = StepUsage(busy_s=0.5, peak_bytes=0, compute_s=0.5)
    assert engine.compute_ratio(usage) == pytest.approx(2.0)
    engine.sizes = []  # a rank without samples
    assert engine.compute_ratio(usage) is None


def _step(step: int, ratio: float | None) -> StepMetrics:
    devices = (DeviceStep(id="a/0", busy_s=0.1, wait_s=0.0, peak_bytes=1, compute_ratio=ratio),)
    return StepMetrics(step=step, loss=1.0, step_s=0.1, samples_per_s=80.0, devices=devices)


def test_a_slow_step_between_paced_ones_is_not_a_busy_host() -> None:
    """The streak starts again after a step that kept pace; a real GPU has no ratio."""
    watch = PaceWatch()
    ratios = [1.5, 1.5, 0.4, 1.5, 1.5, None, 1.5, 1.5]
    assert [watch.observe(_step(i, r)) for i, r in enumerate(ratios)] == [None] * len(ratios)
    notice = watch.observe(_step(8, 1.4))
    assert notice is not None and notice.lags == (("a/0", 1.4),)
    assert "keep a/0's pace (compute 1.4x its paced time)" in notice.message()
    assert watch.observe(_step(9, 1.5)) is None  # once per job


def test_re_planning_does_not_take_a_host_bound_step_for_a_slower_gpu() -> None:
    """The speed monitor never sees a host-bound device's time: a/0 at 3x its busy time
    for a dozen steps is re-planned around when its GPU slowed (its compute still fits its
    stretched pacing), and not when the host could not keep its pace."""
    from scheduler.cost.profile import Profile
    from scheduler.replan.speed import SpeedSettings
    from workers.run.replanning import LiveReplanning, Replanner

    profile = Profile(model="gpt-tiny", devices=(unit_device("a/0"), unit_device("a/1")))
    plan = manual_plan([("a/0", 4, 4), ("a/1", 4, 4)])

    def decisions(*, host_bound: bool) -> list:
        config = LiveReplanning(profile=profile, strategy="dp", total_steps=100,
                                speed=SpeedSettings(calibration_steps=3))  # fmt: skip
        replanner, out = Replanner(config), []
        for step in range(20):
            slow = step >= 8
            ratio = (1.5 if host_bound else 0.2) if slow else 0.6
            devices = (
                DeviceStep(id="a/0", busy_s=0.3 if slow else 0.1, wait_s=0.0, peak_bytes=1,
                           compute_ratio=ratio),
                DeviceStep(id="a/1", busy_s=0.1, wait_s=0.0, peak_bytes=1, compute_ratio=0.6),
            )  # fmt: skip
            metrics = StepMetrics(step=step, loss=1.0, step_s=0.3, samples_per_s=1.0,
                                  devices=devices)  # fmt: skip
            out.append(replanner.observe(metrics, plan, switch_cost_s=0.0))
        return [d for d in out if d is not None]

    assert decisions(host_bound=False) != []
    assert decisions(host_bound=True) == []
