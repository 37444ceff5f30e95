"""``model_from_ref``: presets, dimensions, and Hugging Face configs inside the data directory."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from api.services import model_from_ref
from scheduler.errors import HetschedError
from scheduler.models.hf_config import hf_config_from_preset
from scheduler.models.presets import get_preset


def test_a_config_inside_the_data_directory_is_a_model(tmp_path: Path) -> None:
    (tmp_path / "tiny-llama").mkdir()
    config = hf_config_from_preset(get_preset("llama-tiny"))
    (tmp_path / "tiny-llama" / "config.json").write_text(json.dumps(config))
    for ref in ("tiny-llama/config.json", "hf:tiny-llama", "./tiny-llama"):
        model = model_from_ref(ref, data_dir=tmp_path)
        assert (
            model.name == "tiny-llama" and model.num_params == get_preset("llama-tiny").num_params
        )
    assert model_from_ref("gpt-tiny", data_dir=tmp_path) == get_preset("gpt-tiny")


def test_a_config_path_outside_the_data_directory_is_refused(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "config.json").write_text(json.dumps(hf_config_from_preset(get_preset("gpt-tiny"))))
    data = tmp_path / "data"
    data.mkdir()
    for ref in ("../outside/config.json", str(outside / "config.json"), "hf:../outside"):
        with pytest.raises(HetschedError, match="is outside the server's data directory"):
            model_from_ref(ref, data_dir=data)
    with pytest.raises(HetschedError, match="reads model configs only from its data directory"):
        model_from_ref("x/config.json")
