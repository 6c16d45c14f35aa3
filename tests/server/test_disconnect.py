"""A client that hangs up while a whole answer (its n choices gathered) is computed: the work is
cancelled, the route sees Disconnected, and asyncio logs nothing (a cancelled gather ends with
CancelledError set as its exception, which asyncio reports as never retrieved unless it is read:
the soak found one such traceback per client that gave up on a whole answer)."""

from __future__ import annotations

import asyncio
import gc

import pytest
from starlette.requests import Request

from strata.server.respond import Disconnected, unless_disconnected


def _request_that_hangs_up(after: asyncio.Event) -> Request:
    async def receive() -> dict:
        await after.wait()
        return {"type": "http.disconnect"}

    return Request({"type": "http", "method": "POST", "path": "/v1/chat/completions", "headers": []}, receive)


async def _answers_until_hung_up() -> tuple[bool, list[dict]]:
    reported: list[dict] = []
    asyncio.get_running_loop().set_exception_handler(lambda loop, context: reported.append(context))
    hung_up = asyncio.Event()
    started = [asyncio.Event(), asyncio.Event()]

    async def choice(i: int) -> str:
        started[i].set()
        await asyncio.Event().wait()  # an answer that never ends by itself
        return "never"

    request = _request_that_hangs_up(hung_up)
    work = asyncio.gather(choice(0), choice(1))
    waiting = asyncio.ensure_future(unless_disconnected(request, work))
    for s in started:
        await s.wait()
    hung_up.set()
    with pytest.raises(Disconnected):
        await waiting
    for _ in range(5):  # the cancelled choices and the gather settle
        await asyncio.sleep(0)
    done = work.done()  # its outcome is not read here: that is the route's to do
    del work, waiting
    gc.collect()
    await asyncio.sleep(0)
    return done, reported


def test_a_hang_up_cancels_the_gathered_choices_and_logs_nothing():
    done, reported = asyncio.run(_answers_until_hung_up())
    assert done
    assert reported == [], [c.get("message") for c in reported]
