"""``/api/v1/datasets``: uploads land in the data directory, checked, never outside it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient

from api.services import resolve_dataset
from scheduler.errors import HetschedError

DATASETS = "/api/v1/datasets"
SIDECAR = {"dtype": "uint16", "vocab_size": 1000, "tokenizer": None}
IDS = (np.arange(5000) % 1000).astype(np.uint16).tobytes()


def upload(client: TestClient, name: str, body: bytes) -> tuple[int, dict]:
    response = client.post(DATASETS, params={"name": name}, content=body)
    return response.status_code, response.json()


def test_upload_a_token_file_then_list_it_and_submit_a_job(
    offline: TestClient, tmp_path: Path
) -> None:
    assert upload(offline, "corpus.bin", IDS)[1]["detail"] == (
        "corpus.bin: upload its sidecar corpus.bin.json first"
    )
    code, body = upload(offline, "corpus.bin.json", json.dumps(SIDECAR).encode())
    assert code == 201 and body["kind"] == "sidecar"
    code, body = upload(offline, "corpus.bin", IDS)
    assert code == 201, body
    assert body == {
        "name": "corpus.bin",
        "kind": "tokens",
        "size_bytes": 10_000,
        "num_tokens": 5000,
        "vocab_size": 1000,
        "tokenizer": None,
        "problem": None,
    }
    assert (tmp_path / "corpus.bin").read_bytes() == IDS
    code, body = upload(offline, "book.txt", b"hello world " * 500)
    assert code == 201 and body["kind"] == "bytes" and body["num_tokens"] == 6000

    listed = offline.get(DATASETS).json()
    assert [d["name"] for d in listed["data"]] == ["default", "book.txt", "corpus.bin"]
    assert listed["count"] == 3 and listed["data"][0]["kind"] == "bytes"
    assert offline.get("/api/v1/options").json()["datasets"] == [
        "default",
        "book.txt",
        "corpus.bin",
    ]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".upload")]

    job = {"model": "gpt-tiny", "global_batch": 8, "steps": 2, "dataset": "book.txt"}
    assert offline.post("/api/v1/jobs", json=job).status_code == 201


def test_a_dataset_is_checked_against_the_model_and_the_global_batch(
    offline: TestClient, tmp_path: Path
) -> None:
    upload(offline, "corpus.bin.json", json.dumps(SIDECAR).encode())
    upload(offline, "corpus.bin", IDS)
    assert resolve_dataset(tmp_path, "corpus.bin", seq_len=64, vocab_size=1000, global_batch=64)
    with pytest.raises(HetschedError, match="corpus.bin has vocab_size 1000, larger than the mo"):
        resolve_dataset(tmp_path, "corpus.bin", seq_len=64, vocab_size=256)
    with pytest.raises(HetschedError, match="has 4,750 training tokens; one global batch of 128"):
        resolve_dataset(tmp_path, "corpus.bin", seq_len=64, vocab_size=1000, global_batch=128)
    assert resolve_dataset(tmp_path, "default", seq_len=64, global_batch=1000) is None
    with pytest.raises(HetschedError, match="no file 'corpus.bin.json' in the server's data"):
        resolve_dataset(tmp_path, "corpus.bin.json", seq_len=64)


@pytest.mark.parametrize(
    "name",
    [
        "../escape.txt",
        "a/b.txt",
        "..txt",
        ".hidden.txt",
        "/etc/passwd.txt",
        "x\\y.txt",
        "notes.exe",
        "notes.json",
        "hetsched.db",
        "a" * 200 + ".txt",
        "",
    ],
)
def test_names_that_could_leave_the_data_directory_or_are_not_datasets_are_refused(
    offline: TestClient, tmp_path: Path, name: str
) -> None:
    before = sorted(p.name for p in tmp_path.rglob("*"))
    code, body = upload(offline, name, b"hello world " * 100)
    assert code == 422 and body["detail"].startswith("name: ") and "\n" not in body["detail"]
    assert sorted(p.name for p in tmp_path.rglob("*")) == before
    assert not (tmp_path.parent / "escape.txt").exists()


def test_an_existing_file_is_never_replaced(offline: TestClient, tmp_path: Path) -> None:
    assert upload(offline, "book.txt", b"first version " * 100)[0] == 201
    code, body = upload(offline, "book.txt", b"second")
    assert code == 409 and body["detail"] == "name: 'book.txt' exists; uploads never replace a file"
    assert (tmp_path / "book.txt").read_bytes() == b"first version " * 100


@pytest.mark.parametrize(
    ("name", "body", "message"),
    [
        ("c.bin.json", b"{nope", "c.bin.json: not valid JSON"),
        ("c.bin.json", b'{"dtype": "int64", "vocab_size": 5}', "c.bin.json.dtype: must be one of"),
        ("c.bin", IDS + b"\x00", "c.bin has 10001 bytes, not a whole number of uint16 tokens"),
        ("c.bin", np.full(10, 4000, np.uint16).tobytes(), "holds token id 4000, beyond its"),
        ("t.tokenizer.json", b"[1, 2]", "t.tokenizer.json: a tokenizer file must hold a JSON"),
        ("e.txt", b"", "e.txt: the file is empty"),
    ],
)
def test_bad_contents_are_one_line_errors_and_leave_nothing(
    offline: TestClient, tmp_path: Path, name: str, body: bytes, message: str
) -> None:
    if name == "c.bin":
        upload(offline, "c.bin.json", json.dumps(SIDECAR).encode())
    before = sorted(p.name for p in tmp_path.iterdir())
    code, response = upload(offline, name, body)
    assert code == 422 and message in response["detail"], response
    assert "\n" not in response["detail"] and ".upload" not in response["detail"]
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_uploads_over_the_size_limit_are_413(app_client, tmp_path: Path) -> None:
    with app_client(max_upload_bytes=1000) as client:
        code, body = upload(client, "big.txt", b"x" * 1001)
        assert (
            code == 413 and body["detail"] == "body: 1,001 bytes exceed the upload limit of 1,000"
        )

        def chunks():  # no Content-Length: counted while streaming
            for _ in range(5):
                yield b"y" * 300

        response = client.post(DATASETS, params={"name": "big.txt"}, content=chunks())
        assert response.status_code == 413
        assert response.json()["detail"] == "body: more than the upload limit of 1,000 bytes"
        assert upload(client, "ok.txt", b"x" * 1000)[0] == 201
    assert sorted(p.name for p in tmp_path.iterdir() if p.suffix == ".txt") == ["ok.txt"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".upload")]


def test_uploads_need_the_token_when_one_is_set(app_client) -> None:
    with app_client(api_token="s3cret", open_reads=True) as client:
        assert upload(client, "a.txt", b"hello " * 50)[0] == 401
        response = client.post(
            DATASETS,
            params={"name": "a.txt"},
            content=b"hello " * 50,
            headers={"Authorization": "Bearer s3cret"},
        )
        assert response.status_code == 201
        assert client.get(DATASETS).status_code == 200  # reads stay open
