"""``hetsched export`` and HF configs as ``--model``, as a user runs them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from api.commands.prepare_data import train_tokenizer
from api.core.db import make_engine
from api.schemas.jobs import JobCreate
from api.store import JobStore
from scheduler.models.hf_config import hf_config_from_preset
from scheduler.models.presets import get_preset, preset_to_dict
from tests.api.conftest import make_settings, run_cli
from tests.support import make_cluster, manual_plan
from workers.models.families import build_model

transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")
pytest.importorskip("tokenizers")

LLAMA = get_preset("llama-tiny")
ROOT = Path(__file__).resolve().parents[2]


def test_export_a_torch_checkpoint_loads_in_transformers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = build_model(LLAMA, seed=4).eval()
    tokenizer = train_tokenizer("the cat sat on the mat; the dog sat on the log. " * 50, 300)
    tokenizer.save(str(tmp_path / "tok.json"))
    torch.save(
        {"model": model.state_dict(), "preset": preset_to_dict(LLAMA), "tokenizer": "tok.json"},
        tmp_path / "run.pt",
    )
    code, out, err = run_cli(
        capsys, "export", str(tmp_path / "run.pt"), "--format", "hf", "-o", str(tmp_path / "hf")
    )
    assert code == 0, err
    assert "exported llama-tiny (llama, 803,968 parameters)" in out
    assert sorted(p.name for p in (tmp_path / "hf").iterdir()) == [
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    assert hf_tokenizer("the dog sat").input_ids == tokenizer.encode("the dog sat").ids
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    x = torch.randint(0, 256, (1, LLAMA.seq_len))
    with torch.no_grad():
        assert (hf(x).logits - model(x)).abs().max().item() < 1e-4


def test_export_a_safetensors_file_with_its_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    preset = get_preset("gpt-tiny")
    model = build_model(preset, seed=0)
    state = {k: v for k, v in model.state_dict().items() if k != "head.weight"}  # tied
    safetensors_torch.save_file(state, tmp_path / "m.safetensors")
    (tmp_path / "m.safetensors.json").write_text(json.dumps({"preset": "gpt-tiny"}))
    code, _, err = run_cli(capsys, "export", str(tmp_path / "m.safetensors"), "-o", str(tmp_path))
    assert code == 0, err
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["model_type"] == "gpt2" and config["n_layer"] == 4


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        (lambda d: None, "checkpoint: no file "),
        (lambda d: (d / "c.pt").write_text("not a zip"), "checkpoint: cannot read "),
        (lambda d: torch.save({"weights": {}}, d / "c.pt"), "must hold {'model': state_dict"),
        (
            lambda d: torch.save({"model": {}, "preset": "llama-tiny"}, d / "c.pt"),
            "checkpoint: no parameter 'tok_embeddings.weight' for llama-tiny",
        ),
        (
            lambda d: torch.save({"model": {}, "preset": {"name": "x", "layers": 2}}, d / "c.pt"),
            r"c.pt.preset.layers: unknown field; known: name, family",
        ),
    ],
)
def test_bad_checkpoints_are_one_line_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], setup, message: str
) -> None:
    setup(tmp_path)
    code, out, err = run_cli(capsys, "export", str(tmp_path / "c.pt"), "-o", str(tmp_path / "o"))
    assert code == 2 and out == ""
    assert err.startswith("hetsched: error: ") and err.count("\n") == 1
    assert message in err
    assert not (tmp_path / "o").exists()


def test_plan_takes_a_hugging_face_config_as_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = hf_config_from_preset(get_preset("llama-7b"))
    (tmp_path / "llama2").mkdir()
    (tmp_path / "llama2" / "config.json").write_text(json.dumps(config))
    cluster = str(ROOT / "deploy" / "clusters" / "datacenter-generations.yaml")
    by_path = run_cli(
        capsys,
        "plan",
        "--cluster",
        cluster,
        "--model",
        str(tmp_path / "llama2"),
        "--global-batch",
        "64",
        "--json",
    )
    by_name = run_cli(
        capsys,
        "plan",
        "--cluster",
        cluster,
        "--model",
        "llama-7b",
        "--global-batch",
        "64",
        "--json",
    )
    assert by_path[0] == by_name[0]
    assert json.loads(by_path[1] or "{}") == json.loads(by_name[1] or "{}")


# --- durable checkpoints and jobs ------------------------------------------------------


def _store(data_dir: Path) -> JobStore:
    return JobStore(make_engine(make_settings(data_dir).database_url))


def test_a_jobs_checkpoints_export_by_id_and_by_directory(
    local_ray: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A short job writes durable checkpoints; its id, id@step and directory all export
    to what transformers loads with hetsched's logits."""
    from workers.session import CheckpointInfo, Checkpointing, RunConfig, RunHooks, TrainJob, train

    class Listed(RunHooks):  # the service's record of the checkpoints
        def on_checkpoint(self, info: CheckpointInfo, kept_steps: tuple[int, ...]) -> None:
            store.add_checkpoint(job.id, step=info.step, uri=info.uri, keep=list(kept_steps))

    settings = make_settings(tmp_path)
    store = _store(tmp_path)
    job, _ = store.create_job(
        name="export", model_name=LLAMA.name, spec=JobCreate(model="llama-tiny"), submission_id=None
    )
    root = settings.job_checkpoints(job.id)
    result = train(
        TrainJob(cluster=make_cluster(["A100-80GB"]), model=LLAMA, steps=2, seed=3),
        manual_plan([("a/0", 4, 4)]),
        config=RunConfig(keep_state=True, checkpointing=Checkpointing(root=root, every_steps=1)),
        hooks=Listed(),
    )
    assert result.state is not None
    trained = build_model(LLAMA, seed=0)
    trained.load_state_dict(result.state["model"])
    x = torch.randint(0, 256, (2, LLAMA.seq_len))

    def logits_of(out: Path) -> torch.Tensor:
        hf = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
        with torch.no_grad():
            return hf(x).logits

    x1 = tmp_path / "x1"
    code, out, err = run_cli(capsys, "export", job.id, "--data-dir", str(tmp_path), "-o", str(x1))
    assert code == 0, err
    assert f"exported llama-tiny (llama, {LLAMA.num_params:,} parameters) to {x1}" in out
    with torch.no_grad():
        assert (logits_of(x1) - trained(x)).abs().max().item() < 1e-4
    code, _, err = run_cli(capsys, "export", root, "-o", str(tmp_path / "x2"))
    assert code == 0, err
    assert torch.equal(logits_of(tmp_path / "x2"), logits_of(x1))
    code, _, err = run_cli(
        capsys, "export", f"{job.id}@0", "--data-dir", str(tmp_path), "-o", str(tmp_path / "x3")
    )
    assert code == 0, err
    assert not torch.equal(logits_of(tmp_path / "x3"), logits_of(x1))  # one step earlier


def test_job_and_directory_mistakes_are_one_line_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def error(*argv: str) -> str:
        code, out, err = run_cli(capsys, "export", *argv, "-o", str(tmp_path / "o"))
        assert code == 2 and out == "" and err.count("\n") == 1, err
        return err

    assert "no hetsched database in" in error("abc123", "--data-dir", str(tmp_path))
    store = _store(tmp_path)
    assert "export: no job abc123 in" in error("abc123", "--data-dir", str(tmp_path))
    job, _ = store.create_job(name="j", model_name="gpt-tiny", spec=JobCreate(), submission_id=None)
    assert f"export: job {job.id} has no checkpoint yet" in error(
        job.id, "--data-dir", str(tmp_path)
    )
    # checkpoints the service wrote under another HETSCHED_CHECKPOINT_URI
    store.add_checkpoint(job.id, step=3, uri="/elsewhere/step-00000003", keep=[3])
    assert "checkpoints are recorded at /elsewhere/step-00000003, but " in error(
        job.id, "--data-dir", str(tmp_path)
    )
    torn = tmp_path / "checkpoints" / job.id / "step-00000003"
    torn.mkdir(parents=True)
    (torn / "part-0000.safetensors").write_bytes(b"half")
    assert "holds no complete checkpoint; only torn ones (step-00000003" in error(str(torn.parent))
    assert "step-00000003 has no manifest.json; it is torn" in error(str(torn))
    manifest = {"step": 3, "parts": {"part-0000.safetensors": ["model/x"]}}
    (torn / "manifest.json").write_text(json.dumps(manifest))
    assert "lacks the model's dimensions" in error(str(torn))
    manifest["model"] = preset_to_dict(get_preset("gpt-tiny"))
    (torn / "manifest.json").write_text(json.dumps(manifest))
    assert f"checkpoint: {torn} is torn or corrupt" in error(str(torn))
    assert not (tmp_path / "o").exists()
