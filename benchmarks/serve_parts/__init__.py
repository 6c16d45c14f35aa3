"""The parts of benchmarks/serve.py: the servers, the load, the numbers and the plot.

`servers` starts and stops the two servers (strata's and llama.cpp's llama-server) and builds
their command lines; `client` makes the prompts and drives the streaming clients, one level at a
time, recording what each request saw (`measured` adds what the CPUs did meanwhile); `stats`
turns the records into percentiles and the table's rows; `plot` draws serve.png. Nothing here
imports httpx, psutil, numpy, matplotlib or strata at import time, so `serve.py --help` stays fast.
"""
