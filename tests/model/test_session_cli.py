"""`strata session save|restore|inspect|verify` on a tiny random Llama (float32, greedy)."""

from __future__ import annotations

import json
import os
import re

import pytest

from strata.cli import main


def run(capsys, *argv: str) -> tuple[int, dict | None, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, json.loads(out) if out.strip() else None, err


def test_session_commands(tiny_llama_dir, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["session", "--help"])
    assert exit_.value.code == 0 and "save,restore,inspect,verify" in capsys.readouterr().out
    path = str(tmp_path / "chat.strata")
    engine = ["--model", tiny_llama_dir, "--dtype", "float32", "--max-context", "256", "--kv-chunk", "16",
              "--max-new", "5"]
    code, saved, _ = run(capsys, "session", "save", path, "--prompt", "Hello there", *engine)
    assert code == 0 and saved["n_written"] == (tmp_path / "chat.strata").stat().st_size
    code, header, _ = run(capsys, "session", "inspect", path, "--tokens")
    assert code == 0 and header["n_cells"] == saved["n_saved"] == len(header["token_ids"])
    assert header["block_cells"] == 16 and header["checkpoints"] == [0]
    assert header["geometry"] == {"num_layers": 2, "num_kv_heads": 2, "head_dim": 16, "kv_dtype": "f32"}
    code, verified, _ = run(capsys, "session", "verify", path)
    assert code == 0 and verified["ok"] and verified["n_records"] == -(-saved["n_saved"] // 16)
    code, restored, _ = run(capsys, "session", "restore", path, "--prompt", " and more", *engine)
    assert code == 0 and restored["n_restored"] == restored["cached_tokens"] == saved["n_saved"]
    assert restored["n_read"] == saved["n_written"]

    data = bytearray((tmp_path / "chat.strata").read_bytes())
    data[-10] ^= 1  # a flipped bit in the last record
    (tmp_path / "bad.strata").write_bytes(bytes(data))
    code, out, err = run(capsys, "session", "verify", str(tmp_path / "bad.strata"))
    assert code == 1 and out is None and "checksum mismatch" in err
    code, out, err = run(capsys, "session", "restore", str(tmp_path / "bad.strata"), *engine)
    assert code == 1 and out is None and "checksum mismatch" in err


def test_session_save_names_the_storage_error(tiny_llama_dir, tmp_path, capsys):
    """A save the storage refuses (here its directory does not exist) prints the same message as
    the HTTP slots: the cause, the path and the bytes the file needs; exit 1, nothing written."""
    path = str(tmp_path / "gone" / "chat.strata")
    engine = ["--model", tiny_llama_dir, "--dtype", "float32", "--max-context", "256", "--kv-chunk", "16",
              "--max-new", "5"]
    code, out, err = run(capsys, "session", "save", path, "--prompt", "Hello there", *engine)
    assert code == 1 and out is None, err
    assert err.startswith("strata: error: the directory ") and "no longer exists" in err, err
    assert path in err and re.search(r"the file needs [\d,]+ bytes", err), err
    assert os.listdir(tmp_path) == []
