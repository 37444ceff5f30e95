"""A checkpoint is trusted only once it is on disk and verified: parts, then manifest,
then folder are fsynced in that order, and loading skips one whose parts do not match
the sizes and hashes its manifest records, saying why."""

from __future__ import annotations

import io
import logging
import os
import tarfile
from pathlib import Path

import pytest

from api.services import stream_checkpoint
from tests.workers.test_checkpoint_store import PART, write_checkpoint
from workers.checkpoint import MANIFEST, CheckpointStore


def _part(root: Path, step: int) -> Path:
    return root / f"step-{step:08d}" / PART


def test_a_truncated_part_of_the_newest_checkpoint_is_skipped_with_the_reason(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A power loss after the manifest reached the disk but before all of a part did: the
    manifest alone used to make it the latest; now resuming goes on from the previous one."""
    root = tmp_path / "job"
    store = CheckpointStore(str(root))
    for step in (9, 19):
        write_checkpoint(store, step)
    part = _part(root, 19)
    size = part.stat().st_size
    with part.open("r+b") as f:
        f.truncate(size // 2)
    caplog.set_level(logging.WARNING, logger="hetsched.checkpoint")

    resumed = CheckpointStore(str(root)).latest()

    assert resumed is not None and resumed.step == 9
    (line,) = [r.getMessage() for r in caplog.records if "step 19" in r.getMessage()]
    assert f"{PART} has {size // 2} bytes, the manifest says {size} (torn)" in line


def test_a_part_with_the_right_size_but_other_bytes_is_skipped_too(tmp_path: Path) -> None:
    root = tmp_path / "job"
    store = CheckpointStore(str(root))
    for step in (9, 19):
        write_checkpoint(store, step)
    part = _part(root, 19)
    data = bytearray(part.read_bytes())
    data[len(data) // 2] ^= 0xFF
    part.write_bytes(bytes(data))
    assert [c.step for c in store.complete()] == [9]
    assert "SHA-256 differs" in store.skipped[19]
    store.prune(keep_last=2)
    assert (root / "step-00000009").exists(), "the last verified one is never pruned"


def test_parts_then_manifest_then_folder_reach_the_disk_in_that_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every fsync the checkpoint makes, in order, by the path it makes durable."""
    synced: list[str] = []
    real_fsync = os.fsync

    def recording_fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    root = tmp_path / "job"
    write_checkpoint(CheckpointStore(str(root)), 7)
    folder = root / "step-00000007"
    order = [str(folder / PART), str(folder / f"{MANIFEST}.tmp"), str(folder), str(root)]
    assert [p for p in synced if p in order] == [order[0], order[0], *order[1:]], synced
    # the part: by its writer, then again by the driver before the manifest names it


def test_a_download_keeps_its_checkpoint_until_it_ends(tmp_path: Path) -> None:
    """Retention runs while a download streams the oldest checkpoint: the download still
    gets every byte, and the checkpoint goes at the first prune after it ended."""
    root = tmp_path / "job"
    store = CheckpointStore(str(root))
    write_checkpoint(store, 9)
    expected = _part(root, 9).read_bytes()
    opened = store.open_step(9)
    assert opened is not None
    pieces = stream_checkpoint(opened, "job-step-9", chunk_bytes=4096)
    received = [next(pieces)]
    for step in (19, 29):
        write_checkpoint(store, step)
    assert store.prune(keep_last=1) == (29,)
    assert (root / "step-00000009").exists(), "pinned by the download"
    received += list(pieces)
    with tarfile.open(fileobj=io.BytesIO(b"".join(received)), mode="r:gz") as tar:
        assert tar.extractfile(f"job-step-9/{PART}").read() == expected
    store.prune(keep_last=1)
    assert not (root / "step-00000009").exists(), "unpinned: retention removes it"
    assert store.open_step(9) is None, "gone: the route answers 410"
