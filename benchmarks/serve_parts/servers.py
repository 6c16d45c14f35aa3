"""The servers: each in a child process on a free loopback port, their command lines, and
which of the peers this machine can run.

Arms: `strata`; `llama.cpp` (llama-server as it starts by default); `llama.cpp-tuned`
(llama-server reading prompts in pieces of strata's `--prefill-chunk`: `-b`/`-ub` equal to
it, so both servers bound a prefill step alike); `vllm` (vLLM's CPU backend, only where the
interpreter given by `--vllm-python` can import `vllm`; it reads a bf16 safetensors copy of
the same weights, see serve_parts/vllm_model.py).
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import sys
import time

LLAMA_SERVER_GLOB = "/tmp/llamacpp/**/build/bin/llama-server"
STARTUP_TIMEOUT_S = 600  # vLLM compiles its model with torch.compile first (3-4 min on 2 cores)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def find_llama_server() -> str | None:
    """A llama-server build under /tmp/llamacpp, else one on PATH; None when there is none."""
    found = sorted(glob.glob(LLAMA_SERVER_GLOB, recursive=True))
    return found[0] if found else shutil.which("llama-server")


def vllm_missing(python: str) -> str | None:
    """Why `python` cannot run the vLLM arm (None: it imports vllm)."""
    try:
        run = subprocess.run([python, "-c", "import vllm"], capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{python} did not run: {exc}"
    if run.returncode != 0:
        lines = run.stderr.strip().splitlines()
        return f"{python} cannot import vllm ({lines[-1] if lines else f'exit {run.returncode}'})"
    return None


class Server:
    """A server in a child process on a free loopback port; ready once GET /health is 200."""

    def __init__(self, arm: str, cmd: list[str], port: int, log_dir: str, env: dict[str, str] | None = None):
        self.arm, self.cmd, self.port = arm, cmd, port
        self.env = env  # added to this process's environment
        self.url = f"http://127.0.0.1:{port}"
        self.log_path = os.path.join(log_dir, f"{arm.replace('.', '')}.log")
        self.proc: subprocess.Popen | None = None
        self.load_s = float("nan")

    def start(self) -> None:
        import httpx

        t0 = time.perf_counter()
        with open(self.log_path, "w") as log:
            env = None if self.env is None else {**os.environ, **self.env}
            self.proc = subprocess.Popen(self.cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
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
        """CPU seconds the server has used so far (user + system, threads included), with its
        live child processes' (vLLM computes in an engine-core and a worker process)."""
        import psutil

        root = psutil.Process(self.proc.pid)
        total = 0.0
        for proc in [root, *root.children(recursive=True)]:
            try:
                t = proc.cpu_times()
            except psutil.NoSuchProcess:  # ended between the listing and the read
                continue
            total += t.user + t.system
        return total

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


def llama_cmd(args, port: int, model: str, tuned: bool = False) -> list[str]:
    """llama-server with strata's lanes and threads; `tuned`: prompts read in pieces of
    strata's --prefill-chunk tokens (logical and physical batch), as strata reads them."""
    cmd = [
        args.llama_server, "-m", model, "--host", "127.0.0.1", "--port", str(port),
        "-np", str(args.lanes), "-c", str(args.lanes * args.ctx_per_lane),
        "-t", str(args.threads), "-tb", str(args.threads),
    ]
    if tuned:
        cmd += ["-b", str(args.prefill_chunk), "-ub", str(args.prefill_chunk)]
    return cmd


def vllm_cmd(args, port: int, model_dir: str) -> tuple[list[str], dict[str, str]]:
    """vLLM's OpenAI server on the bf16 copy, with strata's lanes, context per lane and threads
    (it lowers torch to one thread unless OMP_NUM_THREADS says otherwise). On its CPU backend
    `--gpu-memory-utilization` is the share of host memory it reserves (default 0.92, refused
    when other processes hold more than 8 %): 0.2 is GiBs more than 8 lanes of 1024 cells need."""
    code = "import sys; from vllm.entrypoints.cli.main import main; sys.argv[0] = 'vllm'; main()"
    cmd = [
        args.vllm_python, "-c", code, "serve", model_dir, "--host", "127.0.0.1", "--port", str(port),
        "--dtype", "bfloat16", "--max-model-len", str(args.ctx_per_lane), "--max-num-seqs", str(args.lanes),
        "--gpu-memory-utilization", "0.2",
    ]
    return cmd, {"OMP_NUM_THREADS": str(args.threads)}


def choose_arms(args) -> tuple[list[str], list[str]]:
    """The arms this machine can run, and a note for each one left out."""
    arms, notes = ["strata"], []
    if args.no_llama:
        notes.append("llama.cpp: left out (--no-llama)")
    elif args.llama_server and os.access(args.llama_server, os.X_OK):
        arms += ["llama.cpp", "llama.cpp-tuned"]
    else:
        notes.append(f"llama.cpp: no llama-server binary ({args.llama_server or LLAMA_SERVER_GLOB} or on PATH): "
                     f"its default and tuned (-b/-ub {args.prefill_chunk}) arms are left out")
    if args.no_vllm:
        notes.append("vllm: left out (--no-vllm)")
    elif (why := vllm_missing(args.vllm_python)) is None:
        arms.append("vllm")
    else:
        notes.append(f"vllm: {why}; its arm is left out (see ../shared/peers/vllm-cpu.md for its own venv, "
                     f"then --vllm-python VENV/bin/python)")
    return arms, notes


def make_servers(args, arms: list[str], model: str, log_dir: str, vllm_dir: str) -> dict[str, Server]:
    """One server per arm, not started yet; the vLLM arm's bf16 copy is made here when missing."""
    from benchmarks.serve_parts.vllm_model import bf16_copy

    servers = {}
    for arm in arms:
        port, env = free_port(), None
        if arm == "strata":
            cmd = strata_cmd(args, port)
        elif arm in ("llama.cpp", "llama.cpp-tuned"):
            cmd = llama_cmd(args, port, model, tuned=arm == "llama.cpp-tuned")
        elif arm == "vllm":
            cmd, env = vllm_cmd(args, port, bf16_copy(model, vllm_dir))
        else:
            raise ValueError(f"unknown arm {arm!r}")
        servers[arm] = Server(arm, cmd, port, log_dir, env)
    return servers
