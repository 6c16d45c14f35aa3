"""`strata serve --kv int8`: the flag parses, and a server on int8 K/V answers a chat and a
follow-up that reuses the first turn's K/V (cached_tokens), with the pool's real bytes."""

from __future__ import annotations

import argparse

from serving import engine_loader, start_server

from strata.engine_args import engine_config
from strata.cells.storage import kv_bytes_per_cell
from strata.server.cli import add_serve_parser
from strata.server.settings import ServerSettings


def test_serve_parses_kv_int8():
    parser = argparse.ArgumentParser()
    add_serve_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["serve", "--kv", "int8"])
    assert engine_config(args).kv_dtype == "int8"


def test_int8_server_reuses_a_cached_turn(gguf_path):
    options = {"dtype": "float32", "kv": "int8", "max_context": 512, "batch": 1, "kv_pool_tokens": 1024,
               "kv_chunk": 64}
    running = start_server(ServerSettings(model_alias="smol"), engine_loader(gguf_path, **options))
    try:
        client = running.openai()
        first = [{"role": "system", "content": "You answer in one line."},
                 {"role": "user", "content": "What is a lighthouse?"}]
        a = client.chat.completions.create(model="smol", messages=first, max_tokens=12, temperature=0)
        assert a.choices[0].message.content.strip()
        follow = first + [{"role": "assistant", "content": a.choices[0].message.content},
                          {"role": "user", "content": "And who keeps it?"}]
        b = client.chat.completions.create(model="smol", messages=follow, max_tokens=6, temperature=0)
        cached = b.usage.prompt_tokens_details.cached_tokens
        assert a.usage.prompt_tokens <= cached < b.usage.prompt_tokens
        m = running.metrics()
        assert m["strata_kv_bytes_per_cell"] == kv_bytes_per_cell("int8", 30, 3, 64) == 11880
    finally:
        running.stop()
