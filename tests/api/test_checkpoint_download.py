"""A checkpoint downloads as a .tar.gz that ``tar`` reads, streamed in pieces."""

from __future__ import annotations

import io
import json
import os
import tarfile
from pathlib import Path

from api.services import stream_checkpoint
from workers.checkpoint import CheckpointStore


def test_a_checkpoint_streams_as_a_tar_gz_with_every_file_whole(tmp_path: Path) -> None:
    step = tmp_path / "step-00000007"
    step.mkdir()
    weights = os.urandom(3_000_001)  # not a whole number of tar blocks
    (step / "part-0000.safetensors").write_bytes(weights)
    (step / "manifest.json").write_text(json.dumps({"step": 7}))

    opened = CheckpointStore(str(tmp_path)).open_step(7)
    assert opened is not None
    pieces = list(stream_checkpoint(opened, "job-step-7", chunk_bytes=64 << 10))

    assert len(pieces) > 40, "read and sent a piece at a time, not as one buffer"
    with tarfile.open(fileobj=io.BytesIO(b"".join(pieces)), mode="r:gz") as tar:
        assert tar.getnames() == ["job-step-7/manifest.json", "job-step-7/part-0000.safetensors"]
        assert tar.extractfile("job-step-7/part-0000.safetensors").read() == weights
        assert json.load(tar.extractfile("job-step-7/manifest.json")) == {"step": 7}
