"""``hetsched export`` and HF configs as ``--model``, as a user runs them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from api.cli import main
from api.commands.prepare_data import train_tokenizer
from scheduler.hf_config import hf_config_from_preset
from scheduler.models import get_preset, preset_to_dict
from workers.models import build_model

transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")
pytest.importorskip("tokenizers")

LLAMA = get_preset("llama-tiny")
ROOT = Path(__file__).resolve().parents[2]


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


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
