"""The profiler on simulated devices: it recovers the pacing and memory it was given, and
measures a device too small for the whole model states (fsdp plans it)."""

from __future__ import annotations

import pytest

from scheduler.cost.profile import analytic_profile
from scheduler.hardware.cluster import parse_cluster
from tests.support import TINY
from workers.devices.calibration import calibrate_host
from workers.devices.device import model_state_bytes
from workers.models.gpt import GPT
from workers.session import WorkerPool, profile_cluster

pytestmark = pytest.mark.usefixtures("local_ray")

# 1.36e-3 of 16 GiB leaves the V100 room for 4 samples of gpt-tiny; the A100 has 5× more;
# a third device, an A100 reporting 8 GB, cannot hold the 13.3 MB of states at all.
CLUSTER = parse_cluster(
    {
        "name": "t",
        "nodes": [
            {
                "name": "a",
                "devices": [
                    {"type": "A100-80GB"},
                    {"type": "V100-16GB"},
                    {"type": "A100-80GB", "memory_gb": 8},
                ],
            }
        ],
        "simulation": {"memory_scale": 1.36e-3},
    }
)
MARGIN = 4.0


def test_profiler_recovers_the_pacing_it_was_given_and_caches(cache_dir, monkeypatch) -> None:
    monkeypatch.setenv("HETSCHED_PACING_MARGIN", str(MARGIN))
    profile = profile_cluster(CLUSTER, TINY, cache_dir=cache_dir, layers=None)
    host = calibrate_host(TINY, cache_dir=cache_dir)
    a100, v100 = profile.device("a/0"), profile.device("a/1")

    # Speed: per-sample time is K · (312 / speed_i) · host, within 5 %.
    assert a100.per_sample_s == pytest.approx(MARGIN * host.per_sample_s, rel=0.05)
    assert v100.per_sample_s == pytest.approx(MARGIN * 312 / 125 * host.per_sample_s, rel=0.05)
    assert v100.per_sample_s / a100.per_sample_s == pytest.approx(312 / 125, rel=0.05)

    # Memory: model states exactly, capacity scaled, the largest micro-batch as designed.
    assert a100.static_bytes == model_state_bytes(GPT(TINY, seed=0))
    assert v100.capacity_bytes == int(16 * 2**30 * 1.36e-3)
    assert v100.max_micro_batch() == 4
    assert a100.max_micro_batch() > 5 * v100.max_micro_batch()
    assert profile.gradient_bytes == 4 * (TINY.num_params + 1)
    assert profile.links == CLUSTER.links

    # Recomputation, measured: full keeps far less per sample and takes longer.
    assert a100.full is not None and a100.selective is not None
    assert a100.full.per_sample_bytes < 0.5 * a100.per_sample_bytes
    assert a100.selective.per_sample_bytes < a100.per_sample_bytes
    assert a100.full.per_sample_s > a100.per_sample_s

    # Too small for the whole states: no micro-batch fits under dp, but fsdp needs its
    # activations and speed, and gets them as measured (they were 1 byte and 1 s a sample).
    small = profile.device("a/2")
    assert small.capacity_bytes < small.static_bytes == a100.static_bytes
    assert small.max_micro_batch() == 0
    assert small.per_sample_bytes == a100.per_sample_bytes
    assert small.per_sample_s == pytest.approx(a100.per_sample_s, rel=0.05)
    assert small.full is not None and small.full.per_sample_bytes == a100.full.per_sample_bytes
    # The sharding figures an analytic profile of the simulated cluster has (gloo: padded).
    assert profile.sharding == analytic_profile(CLUSTER, TINY, simulated=True).sharding
    assert profile.to_dict()["sharding"]["padded_collectives"] is True

    pool = WorkerPool(CLUSTER, simulated=True)
    again = profile_cluster(CLUSTER, TINY, cache_dir=cache_dir, layers=None, pool=pool)
    assert again == profile
    assert pool.pids() == {}, "cached: no worker was started"

    # The host got busier and the live margin doubled: the cache still serves, every time
    # twice what it was (recomputation's too), memory as it was.
    monkeypatch.setenv("HETSCHED_PACING_MARGIN", str(2 * MARGIN))
    busier = profile_cluster(CLUSTER, TINY, cache_dir=cache_dir, layers=None, pool=pool)
    assert pool.pids() == {}, "cached at another margin: no worker was started"
    v100_busier, a100_busier = busier.device("a/1"), busier.device("a/0")
    assert v100_busier.per_sample_s == pytest.approx(2 * v100.per_sample_s)
    assert v100_busier.fixed_s == pytest.approx(2 * v100.fixed_s)
    assert a100_busier.full is not None
    assert a100_busier.full.per_sample_s == pytest.approx(2 * a100.full.per_sample_s)
    assert v100_busier.per_sample_bytes == v100.per_sample_bytes
    assert v100_busier.max_micro_batch() == v100.max_micro_batch()
