"""A session file on disk: its temporary name, its publication, and storage errors by name.

A save writes `.NAME.XXXXXXXX.strata-tmp` (8 random characters of mkstemp's alphabet) beside
NAME, fsyncs it, renames it over NAME and fsyncs the directory: a crash at any point leaves
either the previous NAME or the new one, never half a file under NAME, and at most one
temporary file, which `remove_leftovers` recognises by that exact pattern (and nothing else)
when a server starts on the directory.

An OSError of the filesystem becomes a StorageError subclass naming the path, what was being
done and the bytes the file needs (`storage_error`); other errors pass unchanged. No torch.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import stat
import tempfile

from strata.errors import StorageError, StorageFull, StorageMissing, StoragePermission, StorageReadOnly

log = logging.getLogger("strata")
TMP_SUFFIX = ".strata-tmp"
TMP_PATTERN = re.compile(r"^\.(.+)\.[a-z0-9_]{8}" + re.escape(TMP_SUFFIX) + r"$")


def free_bytes(directory: str) -> int | None:
    try:
        st = os.statvfs(directory)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def storage_error(exc: OSError, path: str, doing: str, num_bytes: int | None = None) -> StorageError | None:
    """The StorageError for `exc`, raised while `doing` (e.g. "writing") session file `path`; None
    for an error that is not the storage's (the caller re-raises it)."""
    directory = os.path.dirname(os.path.abspath(path))
    need = f"; the file needs {num_bytes:,} bytes" if num_bytes is not None else ""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        free = free_bytes(directory)
        has = f", {free:,} are free there" if free is not None else ""
        return StorageFull(path, f"no space left on the device of {directory} while {doing} session file "
                                 f"{path}{need}{has}", num_bytes)
    if exc.errno in (errno.EACCES, errno.EPERM):
        return StoragePermission(path, f"permission denied while {doing} session file {path} (this process "
                                       f"may not use {directory}){need}", num_bytes)
    if exc.errno == errno.EROFS:
        return StorageReadOnly(path, f"{directory} is on a read-only filesystem: cannot go on {doing} session "
                                     f"file {path}{need}", num_bytes)
    if exc.errno in (errno.ENOENT, errno.ENOTDIR) and not os.path.isdir(directory):
        return StorageMissing(path, f"the directory {directory} no longer exists: cannot go on {doing} session "
                                    f"file {path}{need}", num_bytes)
    return None


def raise_storage_error(exc: OSError, path: str, doing: str, num_bytes: int | None = None):
    """Raises the StorageError for `exc` (from it), or `exc` itself when it is not the storage's."""
    error = storage_error(exc, path, doing, num_bytes)
    if error is None:
        raise exc
    raise error from exc


def check_room(path: str, num_bytes: int) -> None:
    """StorageError before anything is written when the directory is gone or lacks the room."""
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise_storage_error(OSError(errno.ENOENT, "missing"), path, "writing", num_bytes)
    free = free_bytes(directory)
    if free is not None and free < num_bytes:
        raise_storage_error(OSError(errno.ENOSPC, "full"), path, "writing", num_bytes)


def open_temporary(path: str, num_bytes: int) -> tuple[int, str]:
    """(fd, name) of a new temporary file beside `path` (see the module doc)."""
    directory = os.path.dirname(os.path.abspath(path))
    try:
        return tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=TMP_SUFFIX, dir=directory)
    except OSError as exc:
        raise_storage_error(exc, path, "creating", num_bytes)


def publish(tmp: str, path: str, num_bytes: int) -> None:
    """Renames the fsynced `tmp` over `path` and fsyncs the directory (the rename survives a crash)."""
    directory = os.path.dirname(os.path.abspath(path))
    try:
        os.replace(tmp, path)
        dir_fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except OSError as exc:
        raise_storage_error(exc, path, "publishing", num_bytes)


def discard(tmp: str) -> None:
    """Removes a temporary file after a failure (it may be gone with its directory)."""
    try:
        os.unlink(tmp)
    except FileNotFoundError:
        pass


def is_leftover(name: str) -> bool:
    return TMP_PATTERN.match(name) is not None


def remove_leftovers(directory: str) -> list[str]:
    """Removes the temporary files a killed save left in `directory` (regular files named as
    `open_temporary` names them, nothing else) and says so once; returns their names."""
    removed = []
    for name in sorted(os.listdir(directory)):
        full = os.path.join(directory, name)
        try:
            if is_leftover(name) and stat.S_ISREG(os.lstat(full).st_mode):
                os.unlink(full)
                removed.append(name)
        except OSError:
            continue
    if removed:
        log.warning("removed %d temporary session file(s) an interrupted save left in %s: %s",
                    len(removed), directory, ", ".join(removed))
    return removed
