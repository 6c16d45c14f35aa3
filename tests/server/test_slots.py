"""POST /slots/{id}?action=save|restore|erase (llama.cpp's shape), confined to --slot-save-path.

A session saved by one server restores in a new `strata serve` process (its own Python),
and the next request that extends it reports every restored cell as `cached_tokens`.
Every name that could leave the directory is a 400 that writes and reads nothing.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import httpx
import pytest
from serving import engine_loader, start_server

from strata.kv.session_format import read_header
from tests.ports import wait_serving
from strata.server.settings import ServerSettings

ENGINE = {"dtype": "bfloat16", "max_context": 512, "batch": 1, "kv_pool_tokens": 1024, "kv_chunk": 16}
PROMPT = list(range(1000, 1040))


@pytest.fixture(scope="module")
def slot_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("slots")


@pytest.fixture(scope="module")
def slot_server(gguf_path, slot_dir):
    running = start_server(ServerSettings(slot_save_path=str(slot_dir)), engine_loader(gguf_path, **ENGINE))
    yield running
    running.stop()


def post(base_url: str, slot: int, action: str, body: dict | None, headers=None) -> httpx.Response:
    return httpx.post(f"{base_url}/slots/{slot}", params={"action": action}, json=body, headers=headers, timeout=120)


def complete(base_url: str, prompt: list[int], max_tokens: int) -> dict:
    r = httpx.post(f"{base_url}/v1/completions", json={"model": "smol", "prompt": prompt, "max_tokens": max_tokens,
                                                        "temperature": 0}, timeout=300)
    assert r.status_code == 200, r.text
    return r.json()


BAD_NAMES = ["a/b", "../escape.bin", "..", ".", "/tmp/absolute.bin", "back\\slash", ".hidden", "x" * 256,
             "nul\0.bin", "", "out-link", "x..y"]


def test_names_that_leave_the_directory_are_400_and_touch_nothing(slot_server, slot_dir, tmp_path):
    outside = tmp_path / "outside.bin"
    outside.write_bytes(b"keep")
    os.symlink(outside, slot_dir / "out-link")
    complete(slot_server.base_url, PROMPT, 4)  # slot 0 holds a conversation to save
    before = sorted(os.listdir(slot_dir))
    for name in BAD_NAMES:
        for action in ("save", "restore"):
            r = post(slot_server.base_url, 0, action, {"filename": name})
            assert r.status_code == 400, (name, action, r.text)
            assert r.json()["error"]["code"] == "invalid_filename", name
    assert sorted(os.listdir(slot_dir)) == before and outside.read_bytes() == b"keep"
    assert not os.path.exists("/tmp/absolute.bin") and not (slot_dir.parent / "escape.bin").exists()
    os.unlink(slot_dir / "out-link")
    before.remove("out-link")
    for body in (None, {"filename": "ok.bin", "path": "/tmp"}):  # no name; an unknown field
        assert post(slot_server.base_url, 0, "save", body).status_code == 400
    assert post(slot_server.base_url, 0, "fly", {"filename": "ok.bin"}).status_code == 400
    assert post(slot_server.base_url, 7, "save", {"filename": "ok.bin"}).json()["error"]["code"] == "invalid_slot"
    r = post(slot_server.base_url, 0, "restore", {"filename": "absent.bin"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_session_file"
    assert sorted(os.listdir(slot_dir)) == before


def test_without_slot_save_path_save_and_restore_are_403(main_server):
    for action in ("save", "restore"):
        r = post(main_server.base_url, 0, action, {"filename": "x.bin"}, main_server.headers)
        assert r.status_code == 403 and r.json()["error"]["code"] == "not_supported"


def test_saved_slot_restores_in_a_new_serve_process(slot_server, slot_dir, gguf_path):
    complete(slot_server.base_url, PROMPT, 8)
    r = post(slot_server.base_url, 0, "save", {"filename": "turn1.bin"})
    assert r.status_code == 200, r.text
    saved = r.json()
    assert saved["id_slot"] == 0 and saved["filename"] == "turn1.bin" and "save_ms" in saved["timings"]
    assert saved["n_written"] == os.path.getsize(slot_dir / "turn1.bin")
    with open(slot_dir / "turn1.bin", "rb") as f:
        history = read_header(f, "turn1.bin")[0].token_ids
    assert saved["n_saved"] == len(history) and history[: len(PROMPT)] == PROMPT

    sock = bound_socket()  # handed to the server as it is: the port is never free meanwhile
    port = sock.getsockname()[1]
    args = ["serve", "--fd", str(sock.fileno()), "--slot-save-path", str(slot_dir), "--model", gguf_path, "--dtype", "bfloat16",
            "--max-context", "512", "--model-alias", "smol", "--batch", "1", "--kv-pool-tokens", "1024", "--kv-chunk", "16"]
    proc = subprocess.Popen([sys.executable, "-m", "strata.cli", *args], stderr=subprocess.PIPE, text=True,
                            pass_fds=[sock.fileno()])
    sock.close()  # the child holds it now
    try:
        base = f"http://127.0.0.1:{port}"
        wait_serving(base, proc, "the second server")
        r = post(base, 1, "restore", {"filename": "turn1.bin"})
        assert r.status_code == 200, r.text
        assert (r.json()["n_restored"], r.json()["n_read"]) == (saved["n_saved"], saved["n_written"])
        slots = httpx.get(f"{base}/slots").json()
        assert slots[1]["state"] == "idle" and slots[1]["conversation_tokens"] == len(history)
        out = complete(base, history + [2000, 2001, 2002], 4)
        assert out["usage"]["prompt_tokens_details"]["cached_tokens"] == len(history)
        assert post(base, 1, "erase", None).json() == {"id_slot": 1, "n_erased": len(history) + 3 + 3}
    finally:
        proc.terminate()
        proc.wait(60)


def bound_socket() -> socket.socket:
    """A loopback TCP socket bound to a port of the kernel's choosing, for `strata serve --fd`."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    return sock


def test_storage_errors_are_named_with_the_path_and_the_bytes(slot_server, slot_dir, monkeypatch):
    """A full disk is a 507, no permission a 403, a directory gone a 409: in the error shape, with
    the file's path and size in the message, and nothing written (tests/model/test_session_storage.py
    has every cause for real; here the HTTP side of each)."""
    import errno

    from strata.kv import session_disk

    complete(slot_server.base_url, PROMPT, 4)
    size = post(slot_server.base_url, 0, "save", {"filename": "size.bin"}).json()["n_written"]
    os.unlink(slot_dir / "size.bin")
    before = sorted(os.listdir(slot_dir))

    def error_of(status: int, code: str) -> dict:
        r = post(slot_server.base_url, 0, "save", {"filename": "full.bin"})
        assert r.status_code == status, r.text
        error = r.json()["error"]
        assert error["code"] == code and error["type"] == "storage_error", error
        assert "full.bin" in error["message"] and f"{size:,} bytes" in error["message"], error
        assert sorted(os.listdir(slot_dir)) == before
        return error

    monkeypatch.setattr(session_disk, "free_bytes", lambda d: 1000)
    assert "1,000 are free" in error_of(507, "insufficient_storage")["message"]
    monkeypatch.undo()

    def denied(*args, **kwargs):
        raise PermissionError(errno.EACCES, "Permission denied")
    monkeypatch.setattr(session_disk.tempfile, "mkstemp", denied)
    error_of(403, "permission_denied")
    monkeypatch.undo()

    moved = slot_dir.parent / (slot_dir.name + "-moved")
    os.rename(slot_dir, moved)
    try:
        r = post(slot_server.base_url, 0, "save", {"filename": "full.bin"})
        assert r.status_code == 409 and r.json()["error"]["code"] == "directory_missing", r.text
    finally:
        os.rename(moved, slot_dir)
    assert post(slot_server.base_url, 0, "save", {"filename": "ok.bin"}).status_code == 200
    os.unlink(slot_dir / "ok.bin")


def test_a_sliding_window_model_in_layer_groups_saves_and_restores(gemma3_path, tmp_path):
    """Gemma 3 in a pool keeps its windowed layers in layer groups (docs/windows.md): its slot
    saves a version 2 file (the groups in the header) and restores it, every cell reused."""
    engine = {**ENGINE, "kv_chunk": 64, "kv_pool_tokens": 2048, "max_context": 1024}
    running = start_server(ServerSettings(slot_save_path=str(tmp_path)), engine_loader(gemma3_path, **engine))
    try:
        base = running.base_url
        complete(base, list(range(1000, 1600)), 4)  # past the 512-cell window
        r = post(base, 0, "save", {"filename": "gemma.bin"})
        assert r.status_code == 200, r.text
        with open(tmp_path / "gemma.bin", "rb") as f:
            header = read_header(f, "gemma.bin")[0]
        history = header.token_ids
        assert header.version == 2 and [g.window for g in header.groups] == [None, 512]
        assert header.groups[1].num_cells < len(history) == r.json()["n_saved"]  # only the window's chunks
        assert post(base, 0, "erase", None).status_code == 200
        r = post(base, 0, "restore", {"filename": "gemma.bin"})
        assert r.status_code == 200 and r.json()["n_restored"] == len(history), r.text
        out = complete(base, history + [2000, 2001], 2)
        assert out["usage"]["prompt_tokens_details"]["cached_tokens"] == len(history)
    finally:
        running.stop()
