"""The parts of benchmarks/soak.py: the requests, the clients, the checks and the plot.

`exchange` sends one request (streaming or not) and classifies how it ended; `clients`
runs the conversations (new turns, follow-ups, branches, near-max-context prompts, drops
mid-stream, retries after Retry-After); `checks` reads /slots, /metrics and /health and
judges the run; `plot` draws soak.png. The server itself is started with
benchmarks/serve_parts/servers.py's `Server`.
"""
