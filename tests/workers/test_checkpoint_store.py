"""The checkpoint store: a checkpoint counts once its manifest is in place, never torn."""

from __future__ import annotations

import pytest
import torch

from scheduler.models.presets import preset_to_dict
from tests.support import TINY
from workers.checkpoint import CheckpointStore, load_part, part_tensors, write_part
from workers.errors import WorkerError
from workers.models.gpt import GPT

PART = "part-0000.safetensors"


def write_checkpoint(store: CheckpointStore, step: int, *, manifest: bool = True) -> None:
    """A gpt-tiny checkpoint at ``step`` as a run writes one (its manifest last, unless not)."""
    model = GPT(TINY, seed=step)
    optimizer = torch.optim.AdamW(model.parameters())
    names = write_part(store.step_uri(step), PART, part_tensors(model, optimizer))
    if manifest:
        store.commit(step, {PART: names}, {"optimizer_steps": 0, "model": preset_to_dict(TINY)})


def test_a_torn_checkpoint_is_never_loaded_and_retention_keeps_the_newest(tmp_path) -> None:
    store = CheckpointStore(str(tmp_path / "job"))
    assert store.latest() is None
    for step in (9, 19, 29):
        write_checkpoint(store, step)
    write_checkpoint(
        store, 39, manifest=False
    )  # the process died after its part, before the manifest
    assert store.latest().step == 29
    store.prune(keep_last=2)
    assert [c.step for c in store.complete()] == [19, 29]
    assert (tmp_path / "job" / "step-00000039").exists(), "newer than the latest: may be in flight"
    write_checkpoint(store, 49)
    store.prune(keep_last=2)
    assert [c.step for c in store.complete()] == [29, 49]
    assert not (tmp_path / "job" / "step-00000039").exists(), "torn and old: cleaned up"
    with pytest.raises(WorkerError, match=r"^checkpoint: no complete checkpoint at step 39"):
        store.get(39)


def test_a_stage_loads_its_slice_of_a_whole_model_checkpoint(tmp_path) -> None:
    """The head-only last stage takes its tied embedding copy from the stored embedding."""
    store = CheckpointStore(str(tmp_path / "job"))
    whole = GPT(TINY, seed=3)
    names = write_part(
        store.step_uri(0),
        PART,
        part_tensors(whole, torch.optim.AdamW(whole.parameters())),
    )
    assert "model/head.weight" not in names and "model/embed.wte.weight" in names
    info = store.commit(0, {PART: names}, {"optimizer_steps": 0})
    last = GPT(TINY, seed=99, first=2, last=TINY.num_layers, embed=False, head=True)
    load_part(info.uri, info.manifest, last, torch.optim.AdamW(last.parameters()))
    assert torch.equal(last.head.weight, whole.embed.wte.weight)
    assert torch.equal(last.blocks["2"].mlp.fc.weight, whole.blocks["2"].mlp.fc.weight)
