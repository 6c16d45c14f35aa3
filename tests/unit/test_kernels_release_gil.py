"""The extension's kernels run without the GIL (strata/csrc/decode_ops.h `NoGil`): while one
runs in the engine thread, another Python thread (the server's asyncio loop) runs.

The check is by order, not by time: a helper thread waits on an event (without the GIL),
then runs a short Python loop and records when it finished. The main thread sets the event
and calls one kernel on a large input. With a switch interval far longer than the call,
a kernel holding the GIL would keep the helper waiting until the main thread blocks in
`join` after the call; a kernel that releases it lets the helper finish during the call.
"""

from __future__ import annotations

import sys
import threading
import time

import pytest
import torch

from tests.conftest import FUSED_ONLY

SPIN = 20_000  # the helper's loop: well under a millisecond


def finishes_during(call) -> tuple[bool, float]:
    """Whether a helper thread, woken just before `call()`, finished while it ran; and the
    call's seconds."""
    go = threading.Event()
    done: list[float] = []

    def helper() -> None:
        go.wait()
        n = 0
        for _ in range(SPIN):
            n += 1
        done.append(time.perf_counter())

    interval = sys.getswitchinterval()
    sys.setswitchinterval(5.0)  # the main thread is never asked to drop the GIL mid-call
    try:
        t = threading.Thread(target=helper)
        t.start()
        time.sleep(0.05)  # the helper is waiting on the event
        go.set()
        start = time.perf_counter()
        call()
        end = time.perf_counter()
        t.join()
    finally:
        sys.setswitchinterval(interval)
    return done[0] < end, end - start


@pytest.mark.parametrize("decode_path", FUSED_ONLY)
@pytest.mark.parametrize("kernel", ["rms_norm", "silu_mul", "add_rms_norm"])
def test_a_long_kernel_lets_another_thread_run(decode_path, decode_ops, kernel):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(8192, 2048, generator=g)  # float32: the test reads no values, only the order of events
    w = torch.ones(2048)
    calls = {
        "rms_norm": lambda: decode_ops.rms_norm(x, w, 1e-5),
        "silu_mul": lambda: decode_ops.silu_mul(x),
        "add_rms_norm": lambda: decode_ops.add_rms_norm(x.clone(), x, w, 1e-5),
    }
    during, seconds = finishes_during(calls[kernel])
    assert seconds > 0.002, f"{kernel} ran {seconds * 1e3:.2f} ms: too short to tell"
    assert during, f"{kernel} held the GIL for its {seconds * 1e3:.1f} ms"
