"""``hetsched cluster-sim`` as a user runs it: tables, --json, --generate, charts, errors."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from api.cli import main
from scheduler.clustersim.trace import load_trace, trace_to_csv
from tests.api.conftest import run_cli
from tests.scheduler.test_clustersim import short_trace

CLUSTER = """
name: tiny-mix
nodes:
  - {name: a, devices: [{type: A100-40GB, count: 2}]}
  - {name: t, devices: [{type: T4-16GB, count: 2}]}
"""
TRACE = """name,arrival_s,model,global_batch,steps,priority,min_devices,max_devices
small,0,gpt2-small,32,300,,,2
medium,30,gpt2-medium,32,100,,,
xl,60,gpt2-xl,16,20,2,1,2
"""


@pytest.fixture
def files(tmp_path: Path) -> tuple[Path, Path]:
    cluster, trace = tmp_path / "c.yaml", tmp_path / "t.csv"
    cluster.write_text(CLUSTER)
    trace.write_text(TRACE)
    return cluster, trace


def _simulate(
    capsys: pytest.CaptureFixture[str], files: tuple[Path, Path], *extra: str
) -> tuple[int, str, str]:
    """``hetsched cluster-sim`` over the fixture's cluster and trace."""
    cluster, trace = files
    return run_cli(capsys, "cluster-sim", "--cluster", str(cluster), "--trace", str(trace), *extra)


def test_json_is_one_object_of_the_documented_shape(
    files: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = _simulate(capsys, files, "--json")
    assert code == 0
    doc = json.loads(out)
    assert set(doc) == {"cluster", "trace", "policies"}
    assert [p["policy"] for p in doc["policies"]] == ["fifo", "fair", "goodput"]
    for p in doc["policies"]:
        for key in ("avg_jct_s", "p50_jct_s", "p99_jct_s", "makespan_s", "utilization"):
            assert isinstance(p[key], float) and p[key] >= 0
        assert p["decision_s_max"] >= 0
        assert [j["name"] for j in p["jobs"]] == ["small", "medium", "xl"]
        for j in p["jobs"]:
            assert j["arrival_s"] <= j["start_s"] <= j["end_s"]
            first = j["allocations"][0]
            assert first["devices"] and first["samples_per_s"] > 0 and first["t_s"] == j["start_s"]
            assert all(d.split("/")[0] in {"a", "t"} for d in first["devices"])


def test_json_stays_the_only_output_when_native_code_prints(
    files: tuple[Path, Path], capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """HiGHS writes to file descriptor 1 from C, past ``sys.stdout``: a line it printed
    once came before the JSON. Such writes go to stderr while the replay runs."""
    from api.commands import cluster_sim

    real = cluster_sim.simulate

    def noisy(*args: object, **kwargs: object) -> object:
        os.write(1, b"Running HiGHS 1.x (native stdout)\n")
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(cluster_sim, "simulate", noisy)
    cluster, trace = files
    code = main(["cluster-sim", "--cluster", str(cluster), "--trace", str(trace), "--json"])
    out, err = capfd.readouterr()
    assert code == 0
    assert [p["policy"] for p in json.loads(out)["policies"]] == ["fifo", "fair", "goodput"]
    assert "Running HiGHS" in err


def test_table_compares_policies_with_fifo(
    files: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = _simulate(capsys, files, "--policy", "fifo,goodput")
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == "3 jobs of t.csv on tiny-mix (4 devices)"
    assert "AVG JCT" in lines[2] and "P99 JCT" in lines[2] and "MAKESPAN" in lines[2]
    assert lines[3].startswith("fifo") and lines[4].startswith("goodput")
    assert "than fifo" in lines[-1]
    assert "simulating goodput" in err


def test_bound_says_what_no_policy_beats_and_every_policy_is_above_it(
    files: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = _simulate(capsys, files, "--bound", "--json")
    assert code == 0
    doc = json.loads(out)
    bound = doc["lower_bound"]
    assert bound["avg_jct_s"] == bound["shared_avg_jct_s"] >= bound["alone_avg_jct_s"] > 0
    for p in doc["policies"]:
        assert p["avg_jct_s"] >= bound["avg_jct_s"], p["policy"]
    # A schedule that knows the trace and pays for its restarts as the replays do is
    # between the two; with restarts free it does better, still not below the bound.
    found, free = doc["best_found"], doc["best_found_restarts_free"]
    assert found["reallocation_s"] == 60
    assert bound["avg_jct_s"] * 0.999 <= free["avg_jct_s"] < found["avg_jct_s"]
    assert found["avg_jct_s"] <= min(p["avg_jct_s"] for p in doc["policies"])
    code, out, err = _simulate(capsys, files, "--bound", "--policy", "goodput")
    assert code == 0
    assert out.splitlines()[-2].startswith("no policy averages below ")
    assert out.splitlines()[-1].startswith("the best schedule found knowing the whole trace")
    # The program can take minutes: the user is told what it is waiting for.
    assert "bounding the average JCT of" in err


def test_chart_is_a_png(
    files: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("matplotlib")
    png = tmp_path / "jct.png"
    code, _, _ = _simulate(capsys, files, "--chart", str(png), "--policy", "fair")
    assert code == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_generate_writes_a_trace_the_simulator_reads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out_file = tmp_path / "gen.csv"
    code, _, err = run_cli(
        capsys, "cluster-sim", "--generate", "12", "--rate", "6", "--seed", "3", "-o", str(out_file)
    )
    assert code == 0 and "wrote 12 jobs" in err
    assert len(load_trace(out_file)) == 12
    code, out, _ = run_cli(capsys, "cluster-sim", "--generate", "2", "--seed", "3")
    assert code == 0 and out.startswith("name,arrival_s,model,global_batch,steps")


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--policy", "lottery"], "--policy: unknown 'lottery'; allowed: fifo, fair, goodput"),
        (["--round-s", "0"], "--round-s: must be a number of seconds > 0, got 0"),
        (["--reallocation-s", "-1"], "--reallocation-s: must be a number of seconds >= 0, got -1"),
        (["--round-s", "nan"], "--round-s: must be a number of seconds > 0, got nan"),
    ],
)
def test_bad_options_are_one_line_errors(
    files: tuple[Path, Path], capsys: pytest.CaptureFixture[str], extra: list[str], message: str
) -> None:
    code, out, err = _simulate(capsys, files, *extra)
    assert code == 2 and out == ""
    assert err.startswith("hetsched: error: ") and message in err and err.count("\n") == 1


def test_bad_paths_and_flags_out_of_place_fail_before_any_replay(
    files: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cases = [
        (
            ["--generate", "5", "-o", str(tmp_path / "no" / "x.csv")],
            f"-o/--output: folder {tmp_path / 'no'} does not exist",
        ),
        (["--generate", "5", "-o", str(tmp_path)], f"-o/--output: {tmp_path} is a folder"),
        (
            ["--cluster", str(files[0]), "--trace", str(files[1]), "--chart", "jct.txt"],
            "--chart: jct.txt must end in .png, .pdf, .svg, got .txt",
        ),
        (
            ["--cluster", str(files[0]), "--trace", str(files[1]), "--seed", "5"],
            "--seed: only with --generate N",
        ),
        (
            ["--cluster", str(files[0]), "--trace", str(files[1]), "-o", "out.csv"],
            "-o/--output: writes a trace, with --generate N or with --trace FILE",
        ),
    ]
    for extra, message in cases:
        code, out, err = run_cli(capsys, "cluster-sim", *extra)
        assert code == 2 and out == "", extra
        assert err.startswith("hetsched: error: ") and message in err, (extra, err)
        assert err.count("\n") == 1 and "simulating" not in err, extra


def test_a_spreadsheets_byte_order_mark_is_not_a_column(
    files: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    _, trace = files
    trace.write_bytes(b"\xef\xbb\xbf" + TRACE.encode())
    code, out, _ = _simulate(capsys, files, "--policy", "fair", "--json")
    (fair,) = json.loads(out)["policies"]
    assert code == 0 and [j["name"] for j in fair["jobs"]] == ["small", "medium", "xl"]


def test_a_bad_trace_row_names_row_and_column(
    files: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    _, trace = files
    trace.write_text(TRACE + "broken,90,gpt2-small,-4,10,,,\n")
    code, _, err = _simulate(capsys, files)
    assert code == 2
    assert err == (
        "hetsched: error: trace row 5, column global_batch: must be an integer >= 1, got '-4'\n"
    )


def test_missing_inputs_say_what_to_give(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(capsys, "cluster-sim")
    assert code == 2 and "give --cluster FILE and --trace FILE, or --generate N" in err
    code, _, err = run_cli(capsys, "cluster-sim", "--trace", "t.trace", "--bound")
    assert code == 2 and "--bound: a bound is for a trace on a cluster; give --cluster FILE" in err
    code, _, err = run_cli(capsys, "cluster-sim", "--generate", "5", "--bound")
    assert code == 2 and "--generate: writes a trace; run it without" in err


def test_a_public_trace_converts_and_replays(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    public = Path(__file__).resolve().parents[2] / "deploy" / "traces" / "public"
    out_file = tmp_path / "sia.csv"
    sia = public / "sia-newtrace-workload-1.csv"
    code, _, err = run_cli(
        capsys, "cluster-sim", "--trace", str(sia), "--trace-format", "sia", "-o", str(out_file)
    )
    assert code == 0 and "wrote 60 jobs" in err
    jobs = load_trace(out_file)
    assert jobs[0].name == "deepspeech2-0" and jobs[0].max_devices == 8
    code, _, err = run_cli(
        capsys, "cluster-sim", "--trace", str(sia), "--trace-format", "philly", "-o", "x"
    )
    assert code == 2 and "--trace-format: unknown 'philly'; allowed: csv, gavel, sia" in err


@pytest.mark.parametrize(
    ("trace", "fmt"),
    [("gavel-max-min-fairness.trace", "gavel"), ("sia-philly-workload-1.csv", "sia")],
)
def test_a_public_trace_read_as_csv_names_the_flag_it_needs(
    capsys: pytest.CaptureFixture[str], trace: str, fmt: str
) -> None:
    public = Path(__file__).resolve().parents[2] / "deploy" / "traces" / "public"
    argv = ("cluster-sim", "--cluster", "hetero-64", "--trace", str(public / trace))
    code, out, err = run_cli(capsys, *argv, "--policy", "fifo")
    assert code == 2 and out == "" and err.count("\n") == 1
    assert err.rstrip().endswith(f"a {fmt} trace: add --trace-format {fmt}")


def test_a_trace_that_would_replay_for_ages_is_refused_at_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text(f"name,arrival_s,model,global_batch,steps\nforever,0,gpt2-small,64,{10**12}\n")
    argv = ("cluster-sim", "--cluster", "hetero-64", "--trace", str(trace), "--policy", "fair")
    code, out, err = run_cli(capsys, *argv)
    assert code == 2 and err.count("\n") == 1
    assert "trace job 'forever': steps 1,000,000,000,000 take at least" in err
    assert err.rstrip().endswith("lower its steps or raise --round-s")
    # the same job at a length a cluster can finish replays
    trace.write_text(trace.read_text().replace(str(10**12), "1000"))
    code, out, _ = run_cli(capsys, *argv)
    assert code == 0 and "fair" in out


def test_bound_also_answers_whether_the_tail_must_pay_for_the_average(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # On this trace the lowest average the search finds leaves a long job for last, p99
    # above fair's; the user also gets the best schedule found that keeps fair's p99.
    spec = tmp_path / "small-mixed.yaml"
    spec.write_text(
        "name: small-mixed\nnodes:\n"
        "  - {name: a, devices: [{type: A100-40GB, count: 4}]}\n"
        "  - {name: t, devices: [{type: T4-16GB, count: 4}]}\n"
        "  - {name: r, devices: [{type: RTX2080TI-11GB, count: 4}]}\n"
    )
    csv = tmp_path / "t.csv"
    csv.write_text(trace_to_csv(short_trace(10, seed=1)))
    args = ("cluster-sim", "--cluster", str(spec), "--trace", str(csv), "--bound")
    code, out, _ = run_cli(capsys, *args, "--json")
    assert code == 0
    doc = json.loads(out)
    fair = next(p for p in doc["policies"] if p["policy"] == "fair")
    assert doc["best_found"]["p99_jct_s"] > fair["p99_jct_s"]
    capped = doc["best_found_p99_capped"]
    assert capped["meets_cap"] and capped["p99_jct_s"] <= fair["p99_jct_s"] * 1.001
    assert capped["avg_jct_s"] >= doc["lower_bound"]["avg_jct_s"] * 0.999
    code, out, _ = run_cli(capsys, *args, "--policy", "fair")
    assert code == 0
    assert out.splitlines()[-1].startswith("with its p99 held at fair's (")
    # without fair among the replays there is no p99 to hold it to
    code, out, _ = run_cli(capsys, *args, "--policy", "goodput", "--json")
    assert "best_found_p99_capped" not in json.loads(out)
