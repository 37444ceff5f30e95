"""``hetsched plan`` and ``hetsched gpus`` as a user runs them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from api.cli import main
from scheduler.cost.profile import analytic_profile, save_profile
from scheduler.hardware.catalogue import CATALOGUE
from scheduler.hardware.cluster import load_cluster
from scheduler.models.presets import get_preset
from scheduler.planning.planner import STRATEGIES, make_plan
from tests.api.conftest import run_cli

ROOT = Path(__file__).resolve().parents[2]
MIXED_LAB = ROOT / "deploy" / "clusters" / "mixed-lab.yaml"
HETSCHED = Path(sys.executable).parent / "hetsched"


def test_gpus_table_lists_the_catalogue(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(capsys, "gpus")
    assert code == 0 and err == ""
    header = out.splitlines()[0]
    for column in ("KEY", "NAME", "TFLOP/S", "SUSTAINED", "MEMORY", "BANDWIDTH", "SOURCE"):
        assert column in header
    for key, gpu in CATALOGUE.items():
        (line,) = [row for row in out.splitlines() if row.startswith(key + " ")]
        assert gpu.name in line and gpu.source in line and f"{gpu.peak_tflops:g}" in line
    # what plans price a card at, marked where a measurement of the card sets it
    (l4,) = [row.split() for row in out.splitlines() if row.startswith("L4-24GB ")]
    assert "53.8*" in l4
    (nvl,) = [row.split() for row in out.splitlines() if row.startswith("H100NVL-94GB ")]
    assert "488" in nvl  # scaled from the measured H100 PCIe by its power, not 0.75 of 835
    # fp32, the default precision: an RTX 4090 runs fp32 products at its own measured 53.4,
    # not its 16-bit rate's share of its fp32 peak (86)
    (rtx4090,) = [row.split() for row in out.splitlines() if row.startswith("RTX4090-24GB ")]
    assert "172*" in rtx4090 and "53.4*" in rtx4090


def test_gpus_json(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "gpus", "--json")
    assert code == 0
    gpus = json.loads(out)
    assert [g["key"] for g in gpus] == list(CATALOGUE)
    h100 = next(g for g in gpus if g["key"] == "H100-80GB")
    assert h100["peak_tflops"] == 989.0 and h100["memory_gb"] == 80 and h100["source"]
    assert h100["sustained_tflops"] == h100["measured_gemm_tflops"] == 637.4
    assert "transformers-benchmarks" in h100["measured_source"]
    l4 = next(g for g in gpus if g["key"] == "L4-24GB")
    assert l4["sustained_tflops"] < l4["peak_tflops"] / 2  # its 72 W cap binds
    assert l4["sustained_fp32_tflops"] == l4["measured_fp32_gemm_tflops"] == 10.66
    assert "torch-performance-test-data" in l4["measured_fp32_source"]


def test_the_plan_header_says_what_it_was_priced_in(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    one = tmp_path / "one.yaml"
    one.write_text("name: one\nnodes:\n  - name: a\n    devices: [{type: A100-80GB}]\n")
    args = ("--cluster", str(one), "--model", "gpt-tiny", "--global-batch", "8")
    code, out, _ = run_cli(capsys, "plan", *args)
    assert code == 0
    assert out.splitlines()[0].startswith(
        "dp plan for gpt-tiny: global batch 8 on 1 device (cluster one, analytic roofline in fp32"
    )
    code, out, _ = run_cli(capsys, "plan", *args, "--precision", "bf16")
    assert code == 0 and "analytic roofline in bf16" in out.splitlines()[0]


def test_plan_table(capsys: pytest.CaptureFixture[str]) -> None:
    args = ("--cluster", str(MIXED_LAB), "--model", "gpt2-small", "--global-batch", "64")
    code, out, err = run_cli(capsys, "plan", *args)
    assert code == 0 and err == ""
    plan = make_plan(
        analytic_profile(load_cluster(MIXED_LAB), get_preset("gpt2-small")), 64, "auto"
    )
    for column in ("DEVICE", "TYPE", "SAMPLES", "MICRO", "ACCUM", "BUSY", "MEMORY", "SHARE"):
        assert column in out
    for d in plan.devices:
        (row,) = [line for line in out.splitlines() if line.startswith(d.id + " ")]
        cells = row.split()
        assert cells[2:5] == [str(d.samples), str(d.micro_batch), str(d.accum_steps)]
        assert f"{d.samples / 64:.1%}" in row
    assert f"{plan.predicted_samples_per_s:,.1f} samples/s" in out
    for name, base in plan.baselines.items():
        if name == plan.strategy:
            continue  # auto's own pick is the plan shown, not a line under it
        speedup = base.predicted_step_s / plan.predicted_step_s
        (line,) = [row for row in out.splitlines() if row.strip().startswith(f"vs {name} ")]
        assert f"{base.predicted_samples_per_s:,.1f} samples/s" in line
        verdict = "same speed" if abs(speedup - 1) < 0.005 else f"{speedup:.2f}x faster"
        assert verdict in line
    assert plan.baselines["even"].predicted_step_s > 1.5 * plan.predicted_step_s


def test_plan_shows_excluded_devices_with_reasons(capsys: pytest.CaptureFixture[str]) -> None:
    args = ("--cluster", str(MIXED_LAB), "--model", "gpt2-xl", "--global-batch", "7")
    code, out, _ = run_cli(capsys, "plan", *args, "--strategy", "dp")
    assert code == 0
    assert "Excluded:" in out
    assert "node-b/1  model states 24.9 GB exceed capacity 14.0 GB" in out


def test_plan_json_is_exactly_the_plan(capsys: pytest.CaptureFixture[str]) -> None:
    args = ("--cluster", str(MIXED_LAB), "--model", "gpt2-small", "--global-batch", "50")
    code, out, err = run_cli(capsys, "plan", *args, "--strategy", "proportional", "--json")
    assert code == 0 and err == ""
    profile = analytic_profile(load_cluster(MIXED_LAB), get_preset("gpt2-small"))
    assert json.loads(out) == make_plan(profile, 50, "proportional").to_dict()


def test_plan_from_profile_and_efficiency(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    profile = analytic_profile(load_cluster(MIXED_LAB), get_preset("gpt-tiny"), efficiency=0.3)
    path = tmp_path / "profile.json"
    save_profile(profile, path)
    code, out, _ = run_cli(capsys, "plan", "--profile", str(path), "--global-batch", "32", "--json")
    assert code == 0
    from_profile = json.loads(out)
    assert from_profile == make_plan(profile, 32, "auto").to_dict()
    args = ("--cluster", str(MIXED_LAB), "--model", "gpt-tiny", "--efficiency", "0.3")
    code, out, _ = run_cli(capsys, "plan", *args, "--global-batch", "32", "--json")
    assert json.loads(out) == from_profile, "--efficiency reaches the analytic profile"


def test_strategy_choices_come_from_the_scheduler(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["plan", "--help"])
    out, _ = capsys.readouterr()
    for strategy in STRATEGIES:
        assert strategy in out


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--cluster", "missing.yaml", "--model", "gpt2-small"], "cluster: cannot read"),
        (["--profile", "missing.json"], "profile: cannot read"),
        (["--cluster", "{bad}", "--model", "gpt2-small"], "nodes[0].devices[0].type: unknown"),
        (["--cluster", "{lab}", "--profile", "p.json"], "--cluster and --profile"),
        ([], "give --cluster FILE --model PRESET, or --profile FILE"),
        (["--cluster", "{lab}"], "--model: required with --cluster; known: gpt-tiny"),
        (["--cluster", "{lab}", "--model", "gpt5"], "model: unknown preset 'gpt5'"),
        (
            ["--cluster", "{lab}", "--model", "gpt2-small", "--efficiency", "1.5"],
            "--efficiency: must be in (0, 1], got 1.5",
        ),
        # llama-13b's 208 GB of model states exceed the whole lab, recomputation or not
        (["--cluster", "{lab}", "--model", "llama-13b"], "no device can hold the model"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, argv: list[str], expected: str
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nnodes:\n  - name: n\n    devices:\n      - type: GTX1080-8GB\n")
    argv = [a.format(bad=bad, lab=MIXED_LAB) for a in argv]
    code, out, err = run_cli(capsys, "plan", *argv, "--global-batch", "8")
    assert code == 2 and out == ""
    assert err.startswith("hetsched: error: ") and err.count("\n") == 1
    assert expected in err


def test_a_bundled_cluster_is_named_without_its_path(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """From any directory, ``--cluster cephalo-mix`` is the spec shipped with hetsched; a
    file of that name in the directory would win."""
    monkeypatch.chdir(tmp_path)
    args = ("--model", "gpt2-small", "--global-batch", "16", "--json")
    by_name = run_cli(capsys, "plan", "--cluster", "cephalo-mix", *args)
    by_path = run_cli(
        capsys, "plan", "--cluster", str(MIXED_LAB.parent / "cephalo-mix.yaml"), *args
    )
    assert by_name[0] == 0 and by_name == by_path
    (tmp_path / "cephalo-mix").write_text(MIXED_LAB.read_text())
    mine = run_cli(capsys, "plan", "--cluster", "cephalo-mix", *args)
    assert mine[0] == 0 and json.loads(mine[1])["devices"] != json.loads(by_name[1])["devices"]


def test_a_name_that_is_no_file_and_no_bundled_cluster_lists_the_bundled_ones(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as info:
        main(["plan", "--cluster", "cephalo", "--model", "gpt2-small", "--global-batch", "8"])
    err = capsys.readouterr().err
    assert info.value.code == 2 and err.count("\n") == 1
    assert err.startswith(
        "hetsched: error: plan: argument --cluster: no file 'cephalo' and no bundled spec of "
        "that name; bundled: cephalo-mix, cloud-mix, "
    )


@pytest.mark.parametrize("batch", ["0", "-4"])
def test_global_batch_below_one(capsys: pytest.CaptureFixture[str], batch: str) -> None:
    args = ("--cluster", str(MIXED_LAB), "--model", "gpt2-small", "--global-batch", batch)
    code, _, err = run_cli(capsys, "plan", *args)
    assert code == 2
    assert err == f"hetsched: error: --global-batch: must be >= 1, got {batch}\n"


@pytest.mark.parametrize(
    "argv",
    [
        ["--cluster", "x.yaml", "--model", "gpt2-small", "--global-batch", "many"],
        ["--cluster", "x.yaml", "--model", "gpt2-small", "--global-batch", "8", "--strategy", "x"],
        ["--cluster", "x.yaml", "--model", "gpt2-small"],
    ],
)
def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["plan", *argv])
    assert info.value.code == 2
    assert "error:" in capsys.readouterr().err


def test_console_script_plans_without_torch_or_ray(tmp_path: Path) -> None:
    args = ["plan", "--cluster", str(MIXED_LAB), "--model", "gpt2-small", "--global-batch", "64"]
    result = subprocess.run(
        [str(HETSCHED), *args, "--json"], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["global_batch"] == 64
    failed = subprocess.run(
        [
            str(HETSCHED),
            "plan",
            "--cluster",
            str(tmp_path / "none.yaml"),
            "--model",
            "gpt2-small",
            "--global-batch",
            "8",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert failed.returncode == 2 and "Traceback" not in failed.stderr
    assert failed.stderr.startswith("hetsched: error: cluster: cannot read")
    probe = (
        "import sys; from api.cli import main; main(sys.argv[1:]); "
        "print(sorted(m for m in ('torch', 'ray', 'fastapi') if m in sys.modules))"
    )
    imported = subprocess.run(
        [sys.executable, "-c", probe, *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert imported.stdout.strip().splitlines()[-1] == "[]", "hetsched plan stays light"


def test_plan_table_shows_which_devices_recompute(capsys: pytest.CaptureFixture[str]) -> None:
    lab = MIXED_LAB.parent / "university-lab.yaml"
    args = ("--cluster", str(lab), "--model", "llama-7b", "--global-batch", "64")
    code, out, _ = run_cli(capsys, "plan", *args, "--strategy", "pp")
    assert code == 0
    plan = make_plan(analytic_profile(load_cluster(lab), get_preset("llama-7b")), 64, "pp")
    header = out.splitlines()[2]
    assert "RECOMPUTE" in header
    column = header.split().index("RECOMPUTE")
    for d in plan.devices:
        (row,) = [line for line in out.splitlines() if line.startswith(d.id + " ")]
        assert row.split()[column] == d.recompute
    assert {d.recompute for d in plan.devices} == {"none", "full"}
    small = ("--cluster", str(MIXED_LAB), "--model", "gpt2-small", "--global-batch", "64")
    _, out, _ = run_cli(capsys, "plan", *small)
    assert "RECOMPUTE" not in out, "the column appears only when some device recomputes"


def test_a_slower_plan_says_how_many_times_slower(capsys: pytest.CaptureFixture[str]) -> None:
    args = ("--cluster", str(MIXED_LAB), "--model", "gpt2-small", "--global-batch", "64")
    code, out, _ = run_cli(capsys, "plan", *args, "--strategy", "even")
    plan = make_plan(
        analytic_profile(load_cluster(MIXED_LAB), get_preset("gpt2-small")), 64, "even"
    )
    times = plan.predicted_step_s / plan.baselines["proportional"].predicted_step_s
    (line,) = [row for row in out.splitlines() if row.strip().startswith("vs proportional ")]
    assert code == 0 and times > 2 and line.endswith(f"even: {times:.2f}x slower")


def test_a_global_batch_past_the_limit_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    args = ("--cluster", str(MIXED_LAB), "--model", "gpt2-small")
    code, out, err = run_cli(capsys, "plan", *args, "--global-batch", str(10**20))
    assert code == 2 and out == ""
    limit = "must be an integer from 1 to 1,000,000"
    assert err == f"hetsched: error: global_batch: {limit}, got {10**20}\n"
