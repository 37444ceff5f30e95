"""``hetsched simulate`` and ``hetsched profile`` as a user runs them (a fresh process each)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TWO_GPUS = """\
name: two-gpus
nodes:
  - name: box
    devices:
      - type: A100-80GB
      - type: T4-16GB
simulation:
  memory_scale: 0.003
"""


def hetsched(*args: str, cache: Path, timeout: int = 400) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "api.cli", *args, "--cache-dir", str(cache)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_simulate_json_prints_one_object_with_every_strategy(
    tmp_path: Path, cache_dir: Path
) -> None:
    spec = tmp_path / "two.yaml"
    spec.write_text(TWO_GPUS)
    out = hetsched(
        "simulate",
        "--cluster",
        str(spec),
        "--global-batch",
        "8",
        "--steps",
        "3",
        "--seed",
        "2",
        "--strategies",
        "dp,even",
        "--val-every",
        "2",
        "--json",
        cache=cache_dir,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    doc = json.loads(out.stdout)  # stdout is the JSON object and nothing else
    assert set(doc) == {
        "cluster",
        "model",
        "global_batch",
        "steps",
        "seed",
        "precision",
        "profile",
        "ideal_samples_per_s",
        "runs",
        "speedup_vs_even",
        "host",
    }
    # whether the simulated devices kept their pace (one warning line when not)
    assert set(doc["host"]) == {"keeps_pace", "warning", "margin", "load", "lags"}
    assert (doc["host"]["warning"] is None) == doc["host"]["keeps_pace"]
    assert doc["precision"] == "fp32"  # the default: the arithmetic of earlier releases
    assert (doc["cluster"], doc["model"], doc["global_batch"], doc["steps"], doc["seed"]) == (
        "two-gpus",
        "gpt-tiny",
        8,
        3,
        2,
    )
    assert [r["strategy"] for r in doc["runs"]] == ["dp", "even"]
    dp, even = doc["runs"]
    for r in doc["runs"]:
        assert set(r) == {
            "strategy",
            "plan",
            "predicted_step_s",
            "measured_step_s",
            "measured_samples_per_s",
            "losses",
            "val_losses",
            "step_times_s",
            "replans",
            "recoveries",
            "devices",
            "trusted",
        }
        assert len(r["losses"]) == 3 and r["measured_step_s"] > 0
        # evaluated after step 1 (every second) and step 2 (the last), per step in the JSON
        assert [v is None for v in r["val_losses"]] == [True, False, False]
        assert len(r["step_times_s"]) == 3 and r["recoveries"] == []
        assert sum(d["samples"] for d in r["plan"]["devices"]) == 8
        keys = {"id", "busy_s", "wait_s", "peak_bytes", "compute_ratio"}
        assert all(set(d) == keys for d in r["devices"])
    # Same seed, same batches: the split does not change the training.
    assert dp["losses"] == pytest.approx(even["losses"], rel=1e-4)
    assert dp["val_losses"][1:] == pytest.approx(even["val_losses"][1:], rel=1e-4)
    # The A100 is 4.8x a T4: dp gives it more of the batch than even does.
    share = {d["id"]: d["samples"] for d in dp["plan"]["devices"]}
    assert share["box/0"] > share["box/1"]
    assert doc["speedup_vs_even"] == pytest.approx(
        dp["measured_samples_per_s"] / even["measured_samples_per_s"]
    )
    assert doc["ideal_samples_per_s"] > 0
    assert [d["id"] for d in doc["profile"]["devices"]] == ["box/0", "box/1"]
    assert "profiling" in out.stderr  # progress went to stderr


def test_simulate_rejects_a_malformed_fault_in_one_line(tmp_path: Path) -> None:
    out = hetsched("simulate", "--fault", "node-a/0@ten:slow=3", cache=tmp_path, timeout=60)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        "hetsched: error: --fault 'node-a/0@ten:slow=3': STEP must be an integer >= 0, got 'ten'"
    ]


def test_simulate_rejects_an_unknown_strategy_in_one_line(tmp_path: Path) -> None:
    out = hetsched("simulate", "--strategies", "dp,fastest", cache=tmp_path, timeout=60)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        "hetsched: error: --strategies: unknown strategy 'fastest'; allowed: "
        + ", ".join(__import__("scheduler.planning.planner", fromlist=["STRATEGIES"]).STRATEGIES)
    ]
    assert out.stdout == ""


def test_the_table_says_what_a_run_did_about_its_faults() -> None:
    """The recoveries and re-plans of ``--json`` are in the table too (a README fault
    example used to print a table that never mentioned the crash)."""
    from api.commands.simulate import render

    device = {"id": "box/0", "busy_s": 0.1, "wait_s": 0.0, "peak_bytes": 1000}
    run = {
        "strategy": "dp",
        "plan": {"strategy": "dp", "devices": [
            {"id": "box/0", "samples": 8, "micro_batch": 8, "accum_steps": 1, "busy_s": 0.1}
        ]},
        "predicted_step_s": 0.1,
        "measured_step_s": 0.1,
        "measured_samples_per_s": 80.0,
        "losses": [5.0, 4.0],
        "val_losses": [None, None],
        "devices": [device],
        "recoveries": [{"error": "worker died", "failed_step": 12, "resumed_step": 10,
                        "steps_redone": 2, "lost": ["box/1"], "recover_s": 3.14}],
        "replans": [{"step": 17, "switch": True, "reason": "box/0 3.00x slower"}],
    }  # fmt: skip
    doc = {"cluster": "box", "model": "gpt-tiny", "global_batch": 8, "steps": 2, "seed": 0,
           "ideal_samples_per_s": 100.0, "speedup_vs_even": None, "runs": [run]}  # fmt: skip
    text = render(doc)
    assert (
        "  dp           recovered from worker died at step 12: lost box/1, resumed at step 10 "
        "(2 redone) in 3.1 s"
    ) in text.splitlines()
    assert "  dp           re-planned at step 17: box/0 3.00x slower" in text.splitlines()
    assert "recoveries and re-plans:" not in render(
        doc | {"runs": [run | {"recoveries": [], "replans": []}]}
    )
