"""Regenerates the README's screenshots of the browser app (docs/monitor.png, docs/chat.png).

Starts a real `strata serve` (the default model, a pool of 48 chunks of 32 cells, 4 lanes),
drives it with a few chats that share a long system prompt (their first chunks are shared),
a long token-id prompt that evicts an older conversation, and a second one still being read
when the Monitor is captured; then the Chat page after one exchange. Needs Debian's
Chromium (`apt-get install -y chromium`) and playwright (the test extra).

With `--windows`, docs/monitor-windows.png instead: Gemma 3 270M (the gemma3 test package) in a
pool of chunks of 64 cells, its layer groups drawn a row each, after a long conversation, its
follow-up (kept windows) and a branch from its first turn (shared windowed chunks).

    python docs/screenshots.py [--port 8181] [--windows]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
from playwright.sync_api import sync_playwright

HERE = Path(__file__).resolve().parent
SYSTEM = "You are a careful assistant for a harbour office. " * 9  # ~100 tokens: 3 full shared chunks
FLAGS = ["--batch", "3", "--kv-pool-tokens", "1536", "--kv-chunk", "32", "--max-context", "1024",
         "--prefill-chunk", "8"]


def chat(client: httpx.Client, question: str, max_tokens: int = 24) -> None:
    body = {"messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}],
            "max_tokens": max_tokens, "temperature": 0}
    client.post("/v1/chat/completions", json=body).raise_for_status()


def complete(client: httpx.Client, start: int, n: int) -> None:
    body = {"prompt": list(range(start, start + n)), "max_tokens": 4, "temperature": 0}
    client.post("/v1/completions", json=body).raise_for_status()


def windows(page, client: httpx.Client) -> None:
    """Gemma 3's layer groups: a long conversation, its follow-up, a branch from its first turn."""
    first = list(range(2000, 2700))  # 700 ids: its prompt's end keeps the window before 699
    for prompt in (first, first + list(range(5000, 5200)), first + list(range(7000, 7040))):
        client.post("/v1/completions", json={"prompt": prompt, "max_tokens": 8, "temperature": 0}).raise_for_status()
    page.wait_for_function("() => document.querySelectorAll('#window-groups .chunk.shared').length > 0")
    time.sleep(0.5)
    page.screenshot(path=str(HERE / "monitor-windows.png"))


def serve(args) -> subprocess.Popen:
    flags = FLAGS
    if args.windows:
        sys.path.insert(0, str(HERE.parent))
        from benchmarks.window import gemma3_file

        flags = ["--model", gemma3_file(), "--batch", "1", "--kv-pool-tokens", "2048", "--kv-chunk", "64",
                 "--max-context", "1024", "--prefill-chunk", "64", "--spec", "off"]
    return subprocess.Popen([sys.executable, "-m", "strata.cli", "serve", "--port", str(args.port), *flags])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8181)
    parser.add_argument("--chromium", default="/usr/bin/chromium")
    parser.add_argument("--windows", action="store_true", help="docs/monitor-windows.png (Gemma 3 270M's layer groups)")
    args = parser.parse_args()
    base = f"http://127.0.0.1:{args.port}"
    server = serve(args)
    try:
        while True:
            try:
                if httpx.get(base + "/health").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.5)
        with sync_playwright() as p, httpx.Client(base_url=base, timeout=600) as client:
            browser = p.chromium.launch(executable_path=args.chromium, args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1360, "height": 760})
            page.goto(base + "/#monitor")
            page.wait_for_selector("#grid .chunk")
            if args.windows:
                windows(page, client)
                browser.close()
                print(f"wrote {HERE / 'monitor-windows.png'}")
                return 0
            complete(client, 20000, 500)  # the oldest: it gives way later
            for q in ["Where do ferries dock?", "When does the office open?", "Who signs the manifests?"]:
                chat(client, q)
            complete(client, 30000, 560)  # needs room: the oldest conversation is evicted
            reader = threading.Thread(target=complete, args=(client, 40000, 300))
            reader.start()
            page.wait_for_selector("#lanes tr[data-state='prefill']")
            time.sleep(1.5)  # a few frames into the prompt, so its fill shows
            page.screenshot(path=str(HERE / "monitor.png"))
            reader.join()
            page.goto(base + "/#chat")
            page.evaluate("document.getElementById('settings').open = true")
            page.fill("#max-tokens", "60")
            page.dispatch_event("#max-tokens", "change")
            page.fill("#input", "Write a Python function that says hello, with a short explanation.")
            page.click("#send")
            page.wait_for_selector(".message.assistant .cost", timeout=600_000)
            page.screenshot(path=str(HERE / "chat.png"))
            browser.close()
    finally:
        server.terminate()
        server.wait(30)
    print(f"wrote {HERE / 'monitor.png'} and {HERE / 'chat.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
