"""Benchmark: ``hetsched simulate`` on a quiet host and beside 2 and 4 CPU burners, side by side.

Runs ``hetsched simulate --json`` as a user would (a fresh process, a fresh local
Ray and a fresh cache each time) on the bundled four-device ``local-sim.yaml``,
first with nothing else started, then with 2 and with 4 CPU-bound busy loops
(``multiprocessing``, killed after each run), and prints per run: the pacing
margin the live probe chose, the other processes it saw, dp's and even's measured
samples/s over the ideal, predicted over measured step time, dp over even and
whether the devices kept their pace. It checks that each run either kept pace and
measured what the plan predicted (dp >= 85 % of ideal, step within 10 % of the
prediction) or said that it could not.

``pytest -m benchmark -s tests/benchmarks/test_busy_host.py`` (about 15 minutes on
2 cores).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.workers.test_busy_host import burning

REPO = Path(__file__).resolve().parents[2]
LOCAL_SIM = REPO / "deploy" / "clusters" / "local-sim.yaml"
STEPS = 6
GLOBAL_BATCH = 64
BURNERS = (0, 2, 4)

pytestmark = pytest.mark.benchmark


def simulate(cache: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "HETSCHED_PACING_MARGIN"}
    command = [
        sys.executable, "-m", "api.cli", "simulate", "--cluster", str(LOCAL_SIM),
        "--global-batch", str(GLOBAL_BATCH), "--steps", str(STEPS), "--strategies", "dp,even",
        "--cache-dir", str(cache), "--json",
    ]  # fmt: skip
    for _attempt in range(2):  # Ray's own start can time out on a loaded host
        out = subprocess.run(
            command, cwd=REPO, env=env, capture_output=True, text=True, timeout=1800
        )
        if out.returncode == 0 or "timed out during startup" not in out.stderr:
            break
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout)


def _row(burners: int, doc: dict) -> tuple[list[str], dict]:
    ideal = doc["ideal_samples_per_s"]
    runs = {r["strategy"]: r for r in doc["runs"]}
    host = doc["host"]
    load = host["load"] or {}
    cells = [f"{burners}", f"{host['margin']:g}", f"{load.get('others', float('nan')):.1f}"]
    for name in ("dp", "even"):
        r = runs[name]
        cells += [
            f"{r['measured_samples_per_s'] / ideal:.0%}",
            f"{r['predicted_step_s'] / r['measured_step_s']:.2f}",
        ]
    cells += [f"{doc['speedup_vs_even']:.2f}x", "yes" if host["keeps_pace"] else "no"]
    return cells, runs


def test_simulate_keeps_pace_beside_cpu_burners_or_says_it_cannot(tmp_path: Path) -> None:
    docs = {}
    for burners in BURNERS:
        with burning(burners):
            docs[burners] = simulate(tmp_path / f"cache-{burners}")
    header = ["burners", "margin", "others", "dp/ideal", "dp pred/meas", "even/ideal",
              "even pred/meas", "dp/even", "kept pace"]  # fmt: skip
    print(f"\n== local-sim, gpt-tiny, global batch {GLOBAL_BATCH}, {STEPS} steps, dp and even")
    print("  ".join(f"{h:>14}" for h in header))
    rows = {b: _row(b, doc) for b, doc in docs.items()}
    for cells, _runs in rows.values():
        print("  ".join(f"{c:>14}" for c in cells))
    for burners, doc in docs.items():
        if doc["host"]["warning"]:
            print(f"{burners} burners: warning: {doc['host']['warning']}")

    for burners, doc in docs.items():
        _cells, runs = rows[burners]
        if not doc["host"]["keeps_pace"]:  # said so: the figures are marked, not wrong
            assert doc["host"]["warning"] and not all(r["trusted"] for r in doc["runs"])
            continue
        dp = runs["dp"]
        assert dp["measured_samples_per_s"] >= 0.85 * doc["ideal_samples_per_s"], burners
        for r in runs.values():
            assert abs(r["predicted_step_s"] - r["measured_step_s"]) <= 0.10 * r["measured_step_s"]
