"""A long request decoding while the engine's steps wait at the server's step gate
(step_gate.py): each request a test sends meets the engine after a counted number of steps,
so the long one is still decoding however fast this machine runs it (the pool tests' "while a
long one runs", in order rather than in time).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from serving import RunningServer, sse_events


def ids(start: int, n: int) -> list[int]:
    """n distinct token ids from `start`: prompts from different starts share no prefix."""
    return list(range(start, start + n))


REFUSED_WITHIN = 2  # steps: a request in the loop's inbox is submitted after the next, tried at the one after


class Submits:
    """The requests the HTTP side hands one server's engine loop, counted as they are handed
    (the loop's submit wrapped, once per server: monotonic, unlike the count of open requests)."""

    def __init__(self, loop) -> None:
        self.count = 0
        lock = threading.Lock()
        submit = loop.submit_choices

        def counted(*args, **kwargs):
            handles = submit(*args, **kwargs)
            with lock:
                self.count += 1
            return handles

        loop.submit_choices = counted

    @staticmethod
    def on(server: RunningServer) -> Submits:
        loop = server.server.config.app.state.strata.loop
        if not hasattr(loop, "test_submits"):
            loop.test_submits = Submits(loop)
        return loop.test_submits

    def wait_beyond(self, n: int, timeout: float = 120.0) -> None:
        """Until more than `n` requests in all were handed to the loop."""
        deadline = time.monotonic() + timeout
        while self.count <= n:
            assert time.monotonic() < deadline, f"no request past the {n}th reached the engine loop"
            time.sleep(0.005)


class Held:
    """The engine's steps held at the gate while a long stream decodes (see `running_long`)."""

    def __init__(self, server: RunningServer) -> None:
        self.server, self.gate, self.submits = server, server.gate, Submits.on(server)
        self.rest: list[dict] = []  # the long stream's events after the block

    def send(self, fn: Callable[[], object], steps: int = REFUSED_WITHIN, then_release: bool = False):
        """`fn()` (a blocking request) in a thread; once the loop has it, `steps` more steps
        (then the gate opens if `then_release`); returns what fn returned or raises what it raised."""
        before = self.submits.count
        outcome: dict = {}

        def run() -> None:
            try:
                outcome["value"] = fn()
            except BaseException as exc:  # noqa: BLE001 - re-raised in the test's thread
                outcome["error"] = exc

        thread = threading.Thread(target=run)
        thread.start()
        self.submits.wait_beyond(before)
        start = self.gate.steps
        self.gate.allow(steps)
        self.gate.wait_steps(start + steps)
        if then_release:
            self.gate.release()
        thread.join(180)
        assert not thread.is_alive(), "the request did not end within its steps"
        if "error" in outcome:
            raise outcome["error"]
        return outcome["value"]


@contextmanager
def running_long(
    server: RunningServer, start: int, num_prompt: int = 200, max_tokens: int = 16
) -> Iterator[Held]:
    """A streaming completion that has sent text and is still decoding while the block runs:
    the gate holds the engine's steps from its submission on, letting through one at a time
    until its first text arrives; the block's end opens the gate and reads the stream out."""
    body = {
        "prompt": ids(start, num_prompt),
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
    }
    held = Held(server)
    gate = held.gate
    gate.hold()
    try:
        before = held.submits.count
        with server.client() as c, c.stream("POST", "/v1/completions", json=body) as r:
            assert r.status_code == 200  # sse_keepalive_s=0: the stream starts before admission
            events = sse_events(r)
            first = threading.Event()

            def read_to_first_text() -> None:
                for event in events:
                    if json.loads(event)["choices"][0]["text"]:
                        first.set()
                        return

            reader = threading.Thread(target=read_to_first_text)
            reader.start()
            held.submits.wait_beyond(before)
            while not first.is_set():
                steps = gate.steps
                gate.allow(1)
                gate.wait_steps(steps + 1)
                first.wait(2.0)
            reader.join(30)
            yield held
            gate.release()
            if not r.is_closed:  # let it finish, unless the caller hung up
                held.rest.extend(json.loads(e) for e in events if e != "[DONE]")
    finally:
        gate.release()


