"""A strata command with a step hook, for tests that must act while requests run (Ctrl-C in
`strata chat`, SIGTERM to `strata serve` with open streams): `python -m tests.stepped
GATE_FIFO COMMAND ARGS...` runs the real command, with every engine step passing a gate the
test drives through the named pipe GATE_FIFO (`Gate` below is the test's end).

Bytes the test writes: `h` holds the gate (from then on each step waits for an `s`, one
step each), `r` releases it. While open, the gate only looks for a command (without
waiting). A test therefore decides how many steps an answer gets before it acts (Ctrl-C),
whatever this machine's speed. A SIGINT that arrives while a step waits at the gate is
handled (the chat's handler sets its stop flag) before that step runs: the read is
interrupted, Python runs the handler, then waits on.
"""

from __future__ import annotations

import os
import sys


def gate(fifo: str):
    """Wraps `Engine.step` with the gate read from `fifo`."""
    from strata.engine.engine import Engine

    fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # open at once: the test opens its end after
    step = Engine.step
    held = False

    def gated_step(self):
        nonlocal held
        while True:
            os.set_blocking(fd, held)
            try:
                command = os.read(fd, 1)
            except BlockingIOError:
                break  # open, no command: step
            if command == b"":  # no writer (yet, or any more)
                if held:
                    raise RuntimeError("the test closed the step gate while holding it")
                break
            if command == b"h":
                held = True
            elif command == b"r":
                held = False
            elif command == b"s" and held:
                break
        return step(self)

    Engine.step = gated_step


class Gate:
    """The test's end of the gate: make the FIFO, start the command, then `open()`."""

    def __init__(self, path: str):
        self.path = path
        os.mkfifo(path)
        self._pipe = None

    def open(self) -> None:
        """Waits until the command has opened its end (it does so before anything else)."""
        self._pipe = os.fdopen(os.open(self.path, os.O_WRONLY), "wb", buffering=0)

    def hold(self) -> None:
        self._pipe.write(b"h")

    def steps(self, n: int = 1) -> None:
        self._pipe.write(b"s" * n)

    def release(self) -> None:
        self._pipe.write(b"r")

    def close(self) -> None:
        if self._pipe is not None:
            self._pipe.close()


def command(fifo: str, *args: str) -> list[str]:
    """The argv (after the interpreter) that runs `strata ARGS` through the gate `fifo`."""
    return ["-m", "tests.stepped", fifo, *args]


def main() -> int:
    gate(sys.argv[1])
    from strata.cli import main as strata_main

    return strata_main(sys.argv[2:])


if __name__ == "__main__":
    sys.exit(main())
