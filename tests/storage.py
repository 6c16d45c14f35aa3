"""Real storage conditions for the tests: a small or read-only tmpfs where this machine lets the
tests mount one (root, or a container that allows it), and whether permissions bind this process."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator


@contextlib.contextmanager
def tmpfs(path: str, size_bytes: int, read_only: bool = False) -> Iterator[bool]:
    """Mounts a tmpfs of `size_bytes` on the directory `path` for the block; yields False (and
    mounts nothing) where mounting is not allowed here."""
    os.makedirs(path, exist_ok=True)
    options = f"size={size_bytes}" + (",ro" if read_only else "")
    try:
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", path], capture_output=True,
                              timeout=30).returncode == 0
    except (OSError, subprocess.SubprocessError):
        done = False
    try:
        yield done
    finally:
        if done:
            subprocess.run(["umount", "-l", path], capture_output=True, timeout=30)


def permissions_bind() -> bool:
    """A directory without write permission refuses this process (it is not root)."""
    return os.geteuid() != 0
