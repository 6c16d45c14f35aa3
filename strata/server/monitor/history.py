"""The machine and the server over the last minutes: one sample a second, kept for `HISTORY_S`.

CPU and RAM come from psutil; tokens/s from the server's `strata_generation_tokens`
counter; queue and running requests and pool use from the engine thread's latest snapshot
(read, never the engine itself). Sampling starts with the first monitor feed and then runs
for the server's life (asyncio.run cancels it at shutdown).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import psutil
from prometheus_client import Counter

from strata.engine.interface import EngineSnapshot

HISTORY_S = 300
PERIOD_S = 1.0
MIB = 1 << 20


@dataclass(frozen=True)
class Sample:
    at: float  # wall-clock seconds
    tokens_per_s: float  # generated tokens over the last period
    num_queued: int
    num_running: int
    pool_used: float  # held chunks / total
    cpu_percent: float  # the whole machine, 0..100
    process_cpu_percent: float  # this server, 0..100 x cores
    rss_mib: float  # this server
    ram_used_percent: float  # the whole machine


def counter_total(counter: Counter) -> float:
    for metric in counter.collect():
        for sample in metric.samples:
            if sample.name.endswith("_total"):
                return sample.value
    return 0.0


class History:
    def __init__(self, tokens: Counter, snapshot: Callable[[], EngineSnapshot | None]):
        self._tokens = tokens
        self._snapshot = snapshot
        self._process = psutil.Process()
        self.samples: deque[Sample] = deque(maxlen=int(HISTORY_S / PERIOD_S))
        self._task: asyncio.Task | None = None
        self._last: tuple[float, float] | None = None  # (monotonic time, tokens) of the last sample

    def start(self) -> None:
        """Idempotent; call on the asyncio thread."""
        if self._task is None:
            self._process.cpu_percent(None)  # psutil's first reading of a process is 0: prime it
            psutil.cpu_percent(None)
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        while True:
            self.samples.append(self.sample())
            await asyncio.sleep(PERIOD_S)

    def sample(self) -> Sample:
        now, tokens = time.monotonic(), counter_total(self._tokens)
        rate = 0.0
        if self._last is not None and now > self._last[0]:
            rate = (tokens - self._last[1]) / (now - self._last[0])
        self._last = (now, tokens)
        snap = self._snapshot()
        return Sample(
            at=time.time(),
            tokens_per_s=rate,
            num_queued=snap.num_queued if snap else 0,
            num_running=snap.num_running if snap else 0,
            pool_used=snap.usage_ratio if snap else 0.0,
            cpu_percent=psutil.cpu_percent(None),
            process_cpu_percent=self._process.cpu_percent(None),
            rss_mib=self._process.memory_info().rss / MIB,
            ram_used_percent=psutil.virtual_memory().percent,
        )
