"""A save the storage refuses is a named error, writes nothing and changes nothing.

Each cause is real where this machine allows it: a small tmpfs that fills up before or during
the save (mounted when the tests may mount, else ENOSPC injected into the save's own file
writes), a directory without write permission (as root, which permissions do not bind, the
permission error is injected where the save creates its file), a read-only tmpfs (else EROFS
injected there) and a directory removed while the save writes. Each is the StorageError
subclass that names it, with the path and the bytes the file needs in its message; no file
is left in the directory, and the pool, the cache and the lanes are as before.
"""

from __future__ import annotations

import errno
import os
import shutil

import pytest

from strata.cells import session as cell_session
from strata.errors import StorageFull, StorageMissing, StoragePermission, StorageReadOnly
from strata.kv import session_disk
from tests.checks import check_scheduler
from tests.model.test_session_inflight import first_turn, make_engine
from tests.storage import permissions_bind, tmpfs


def state(engine) -> tuple:
    s = engine._scheduler
    pool = s.layout.pool
    convs = sorted((c.conv_id, tuple(c.token_ids), tuple(c.table.chunk_ids), c.lane) for c in s.cache)
    return pool.free_ids(), [pool.refcount(i) for i in range(pool.num_total)], convs, [n.pinned_by for n in s.lanes]


@pytest.fixture
def engine(tiny_llama_dir):
    e = make_engine(tiny_llama_dir, pooled=True)
    first_turn(e)
    return e


def file_size(engine, tmp_path) -> int:
    """The bytes lane 0's conversation takes as a session file (saved once, elsewhere)."""
    return engine.save_session(str(tmp_path / "probe.strata"), lane=0).num_bytes


def refused(engine, path: str, error: type, size: int, on_record=None, ignore: tuple[str, ...] = ()) -> Exception:
    before = state(engine)
    directory = os.path.dirname(path)
    listed = sorted(os.listdir(directory)) if os.path.isdir(directory) else None
    job = engine.begin_save_session(path, lane=0, on_record=on_record)
    with pytest.raises(error) as caught:
        engine._sessions.wait(job)
    assert state(engine) == before
    check_scheduler(engine._scheduler)
    if listed is not None and os.path.isdir(directory):
        assert sorted(n for n in os.listdir(directory) if n not in ignore) == listed, "the save left a file"
    message = str(caught.value)
    assert path in message and f"{size:,} bytes" in message, message
    return caught.value


def fill(directory: str) -> None:
    """Writes a filler file until the filesystem is full."""
    with open(os.path.join(directory, "filler"), "wb") as f:
        try:
            while True:
                f.write(b"\0" * 4096)
                f.flush()
        except OSError as exc:
            assert exc.errno == errno.ENOSPC


class FailingWrites:
    """The save's file, whose writes fail with `code` once `limit` bytes are written."""

    def __init__(self, real, limit: int, code: int):
        self.real, self.limit, self.code = real, limit, code

    def __enter__(self):
        self.real.__enter__()
        return self

    def __exit__(self, *exc):
        return self.real.__exit__(*exc)

    def write(self, data) -> int:
        self.limit -= len(data)
        if self.limit < 0:
            raise OSError(self.code, os.strerror(self.code))
        return self.real.write(data)

    def __getattr__(self, name):
        return getattr(self.real, name)


def test_a_full_disk_before_and_during_the_save(engine, tmp_path, monkeypatch):
    small = str(tmp_path / "small")
    size = file_size(engine, tmp_path)
    target = os.path.join(small, "chat.strata")

    def fill_after_first_record(i: int) -> None:
        if i == 0:
            fill(small)

    with tmpfs(small, 64 * 1024) as mounted:
        if mounted:
            with open(os.path.join(small, "ballast"), "wb") as f:  # leaves less room than the file needs
                f.write(b"\0" * (64 * 1024 - 8192))
            error = refused(engine, target, StorageFull, size)
            os.unlink(os.path.join(small, "ballast"))
            refused(engine, target, StorageFull, size, on_record=fill_after_first_record, ignore=("filler",))
            os.unlink(os.path.join(small, "filler"))
        else:  # no mount here: the free space, then the save's own writes, say the disk is full
            os.makedirs(small, exist_ok=True)
            monkeypatch.setattr(session_disk, "free_bytes", lambda d: size - 1)
            error = refused(engine, target, StorageFull, size)
            monkeypatch.undo()
            real_fdopen = os.fdopen
            monkeypatch.setattr(cell_session.os, "fdopen",
                                lambda *a, **k: FailingWrites(real_fdopen(*a, **k), size // 2, errno.ENOSPC))
            refused(engine, target, StorageFull, size)
            monkeypatch.undo()
    assert error.code == "insufficient_storage" and "free there" in str(error)
    engine.save_session(str(tmp_path / "ok.strata"), lane=0)  # the engine saves on elsewhere


def test_no_permission(engine, tmp_path, monkeypatch):
    locked, size = tmp_path / "locked", file_size(engine, tmp_path)
    locked.mkdir()
    if permissions_bind():
        locked.chmod(0o500)
    else:  # root writes anywhere: the refusal comes where the save creates its file
        def no(*args, **kwargs):
            raise PermissionError(errno.EACCES, "Permission denied")
        monkeypatch.setattr(session_disk.tempfile, "mkstemp", no)
    try:
        error = refused(engine, str(locked / "chat.strata"), StoragePermission, size)
    finally:
        locked.chmod(0o700)
    assert error.code == "permission_denied"


def test_a_read_only_filesystem(engine, tmp_path, monkeypatch):
    ro, size = str(tmp_path / "ro"), file_size(engine, tmp_path)
    with tmpfs(ro, 1 << 20, read_only=True) as mounted:
        if not mounted:
            def read_only(*args, **kwargs):
                raise OSError(errno.EROFS, "Read-only file system")
            monkeypatch.setattr(session_disk.tempfile, "mkstemp", read_only)
        error = refused(engine, os.path.join(ro, "chat.strata"), StorageReadOnly, size)
    assert error.code == "read_only_storage"


def test_the_directory_removed_during_the_save(engine, tmp_path):
    gone, size = tmp_path / "gone", file_size(engine, tmp_path)
    gone.mkdir()
    error = refused(engine, str(gone / "chat.strata"), StorageMissing, size, on_record=lambda i: shutil.rmtree(gone))
    assert error.code == "directory_missing" and not gone.exists()
    refused(engine, str(gone / "chat.strata"), StorageMissing, size)  # and before it starts
