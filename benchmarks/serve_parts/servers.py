"""The two servers: each in a child process on a free loopback port, and their command lines."""

from __future__ import annotations

import glob
import os
import socket
import subprocess
import sys
import time

LLAMA_SERVER_GLOB = "/tmp/llamacpp/**/build/bin/llama-server"
STARTUP_TIMEOUT_S = 180


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def find_llama_server() -> str | None:
    found = sorted(glob.glob(LLAMA_SERVER_GLOB, recursive=True))
    return found[0] if found else None


class Server:
    """A server in a child process on a free loopback port; ready once GET /health is 200."""

    def __init__(self, arm: str, cmd: list[str], port: int, log_dir: str):
        self.arm, self.cmd, self.port = arm, cmd, port
        self.url = f"http://127.0.0.1:{port}"
        self.log_path = os.path.join(log_dir, f"{arm.replace('.', '')}.log")
        self.proc: subprocess.Popen | None = None
        self.load_s = float("nan")

    def start(self) -> None:
        import httpx

        t0 = time.perf_counter()
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen(self.cmd, stdout=log, stderr=subprocess.STDOUT)
        deadline = t0 + STARTUP_TIMEOUT_S
        while time.perf_counter() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.arm} exited ({self.proc.returncode}):\n{self.log_tail()}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    self.load_s = time.perf_counter() - t0
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.25)
        self.stop()
        raise RuntimeError(f"{self.arm} did not become ready in {STARTUP_TIMEOUT_S} s:\n{self.log_tail()}")

    def cpu_s(self) -> float:
        """CPU seconds the server process has used so far (user + system, its threads included)."""
        import psutil

        t = psutil.Process(self.proc.pid).cpu_times()
        return t.user + t.system

    def log_tail(self, n: int = 3000) -> str:
        with open(self.log_path, errors="replace") as f:
            return f.read()[-n:]

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def strata_cmd(args, port: int) -> list[str]:
    lanes_besides_main = args.lanes - 1
    return [
        sys.executable, "-m", "strata.cli", "serve", "--host", "127.0.0.1", "--port", str(port),
        "--batch", str(lanes_besides_main), "--max-context", str(args.ctx_per_lane),
        "--prefill-chunk", str(args.prefill_chunk), "--threads", str(args.threads),
        "--dtype", "bfloat16", "--weights", args.weights, "--max-waiting", "64",
    ]


def llama_cmd(args, port: int, model: str) -> list[str]:
    return [
        args.llama_server, "-m", model, "--host", "127.0.0.1", "--port", str(port),
        "-np", str(args.lanes), "-c", str(args.lanes * args.ctx_per_lane),
        "-t", str(args.threads), "-tb", str(args.threads),
    ]
