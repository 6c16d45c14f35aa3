"""A step hook for tests: an engine whose steps wait for the test's permission while held.

`StepGate.wrap(engine)` makes `engine.step()` pass through the gate first. Open (the
default), steps run as usual. After `hold()`, each step waits for one permit (`allow(n)`
gives n); `release()` opens it again. The engine thread waits *before* the step, after the
engine loop posted the previous step's events and snapshot (server/engine_loop.py), so what a
client sees while the gate holds is the state after the last allowed step: a test then
depends on the order of steps, never on how fast this machine runs them.
"""

from __future__ import annotations

import threading
import time

WAIT_S = 300.0  # a held step never waits longer than this (a test that forgot to release)


class StepGate:
    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._held = False
        self._permits = 0
        self._waiting = False
        self.steps = 0  # steps run through the gate

    def wrap(self, engine):
        step = engine.step

        def gated_step():
            self._enter()
            out = step()
            with self._cond:
                self.steps += 1
                self._cond.notify_all()
            return out

        engine.step = gated_step
        return engine

    def _enter(self) -> None:
        with self._cond:
            deadline = time.monotonic() + WAIT_S
            while self._held and self._permits == 0:
                self._waiting = True
                self._cond.notify_all()
                assert self._cond.wait(max(0.0, deadline - time.monotonic())) or not self._held, \
                    "a held step waited too long"
            self._waiting = False
            if self._held:
                self._permits -= 1

    def hold(self) -> None:
        with self._cond:
            self._held, self._permits = True, 0

    def allow(self, n: int = 1) -> None:
        with self._cond:
            self._permits += n
            self._cond.notify_all()

    def release(self) -> None:
        with self._cond:
            self._held, self._permits = False, 0
            self._cond.notify_all()

    def wait_steps(self, n: int, timeout: float = 300.0) -> None:
        """Until `n` steps in all have run through the gate."""
        with self._cond:
            assert self._cond.wait_for(lambda: self.steps >= n, timeout), f"only {self.steps} of {n} steps ran"

    def wait_blocked(self, timeout: float = 300.0) -> None:
        """Until a step waits at the held gate (the engine has work and no permit)."""
        with self._cond:
            assert self._cond.wait_for(lambda: self._waiting, timeout), "no step reached the gate"
