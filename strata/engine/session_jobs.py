"""Session files in flight: the record a front end waits on, and the thread that streams bytes.

The engine's thread starts a save or a restore (`SessionFiles.begin_save/begin_restore`),
holding what the file needs (engine/holds.py), and hands the byte stream to the worker: one
thread, started on first use, that runs streams one after the other at a lower scheduling
priority than the thread that steps (WORKER_NICE: a stream yields the cores to the steps
when both want them, and takes what the steps leave). Listeners hear when a stream ends, so
the engine's thread can settle it between two steps (the server's engine loop wakes on it).
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

log = logging.getLogger("strata")
# Niceness of the worker thread relative to the process (Linux: a thread's own priority).
WORKER_NICE = 10


@dataclass(eq=False)
class SessionJob:
    """A save or a restore in flight. `result` is resolved on the engine's thread, between steps:
    a SessionSaved or SessionRestored, or the error that ended it (the pool, the lanes and the
    cache then are as they were)."""

    kind: str  # "save" | "restore"
    path: str
    lane: int | None
    num_cells: int
    num_records: int
    result: concurrent.futures.Future = field(default_factory=concurrent.futures.Future)
    records_done: int = 0  # records written or read so far (the worker counts them)
    started: float = field(default_factory=time.perf_counter)

    @property
    def done(self) -> bool:
        return self.result.done()


def _lower_priority() -> None:
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), os.getpriority(os.PRIO_PROCESS, 0) + WORKER_NICE)
    except (AttributeError, OSError):
        pass  # not Linux, or not allowed: the stream runs at the process's priority


class SessionWorker:
    """The one thread that streams session files' bytes; `listeners` run (on it) as each ends."""

    def __init__(self) -> None:
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self.listeners: list[Callable[[], None]] = []

    def submit(self, fn: Callable[[], object]) -> concurrent.futures.Future:
        if self._executor is None:
            self._executor = concurrent.futures.ThreadPoolExecutor(
                1, thread_name_prefix="strata-session", initializer=_lower_priority)
        work = self._executor.submit(fn)
        work.add_done_callback(self._ended)
        return work

    def _ended(self, _: concurrent.futures.Future) -> None:
        for listener in list(self.listeners):
            try:
                listener()
            except Exception:  # noqa: BLE001 - a listener's fault must not lose the stream's result
                log.exception("a session listener failed")

    @staticmethod
    def wait_any(works: Iterable[concurrent.futures.Future], timeout: float | None = None) -> None:
        concurrent.futures.wait(list(works), timeout=timeout, return_when=concurrent.futures.FIRST_COMPLETED)

    def shutdown(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None
