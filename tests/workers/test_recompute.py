"""Activation recomputation: less memory, the same training, measured by the profiler."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tests.support import MIXED_CLUSTER, TINY, manual_plan, tiny_job
from workers.devices.device import model_state_bytes
from workers.models.gpt import GPT
from workers.session import train

pytestmark = pytest.mark.usefixtures("local_ray")


def test_a_plan_recomputing_on_some_devices_trains_exactly_as_one_that_does_not(
    cache_dir, mixed_pool
) -> None:
    plain = manual_plan([("a/0", 6, 3), ("a/1", 2, 2), ("a/2", 4, 4)])
    modes = {"a/0": "full", "a/1": "selective", "a/2": "none"}
    mixed = replace(plain, devices=tuple(replace(d, recompute=modes[d.id]) for d in plain.devices))
    job = tiny_job(MIXED_CLUSTER, cache_dir, steps=3, seed=7)
    a = train(job, plain, pool=mixed_pool)
    b = train(job, mixed, pool=mixed_pool)
    assert b.losses == pytest.approx(a.losses, rel=1e-5)
    states = model_state_bytes(GPT(TINY, seed=0))
    kept = {d.id: d.peak_bytes - states for d in a.devices}  # activations per device
    recomputing = {d.id: d.peak_bytes - states for d in b.devices}
    assert recomputing["a/0"] < 0.5 * kept["a/0"], "full recomputation keeps block inputs only"
    assert recomputing["a/1"] < kept["a/1"]
    assert recomputing["a/2"] == kept["a/2"]
