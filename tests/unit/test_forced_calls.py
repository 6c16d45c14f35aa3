"""Forced tool calls' grammars (tool_choice required or named) for every format: a valid call
passes token by token, and the whitespace between JSON tokens is bounded as a response format's
is, so a weak model cannot pad a forced call until max_tokens (a tiny random model did, with
llguidance's unbounded default inside Lark's `%json`)."""

from __future__ import annotations

import pytest
import torch

from strata.grammar.compiler import GrammarCompiler
from strata.server.tools.choice import Tool, ToolSetup, forced_grammar
from strata.server.tools.parsers import FORMATS

UNIT = {"type": "object", "properties": {"unit": {"enum": ["celsius", "fahrenheit"]}}, "required": ["unit"],
        "additionalProperties": False}
CALLS = {  # format -> the call with {ws} where the model may put whitespace
    "hermes": '<tool_call>\n{{"name": "pick_unit", "arguments":{ws}{{"unit": "celsius"}}}}\n</tool_call>',
    "llama3_json": '{{"name": "pick_unit", "parameters":{ws}{{"unit": "celsius"}}}}',
    "mistral": '[TOOL_CALLS][{{"name": "pick_unit", "arguments":{ws}{{"unit": "celsius"}}}}]',
}


@pytest.fixture(scope="module")
def compiler(smol_tokenizer):
    tok = smol_tokenizer
    return GrammarCompiler(tok.backend.to_str(), tok.backend.get_vocab_size(), tok.eos_token_ids)


def walks(compiler, grammar_source: str, text: str, tokenizer) -> bool:
    """Whether the grammar allows `text`'s tokens one by one, as the sampler's mask would."""
    matcher = compiler.compile("lark", grammar_source, "tools").matcher()
    for token in tokenizer.encode(text, add_special_tokens=False):
        row = torch.zeros(1, compiler._vocab_size)
        matcher.fill_masks(row)
        if row[0, token] == -torch.inf:
            return False
        matcher.accept(token)
    return True


@pytest.mark.parametrize("name", sorted(CALLS))
def test_a_forced_call_passes_and_its_whitespace_is_bounded(compiler, smol_tokenizer, name):
    setup = ToolSetup((Tool("pick_unit", None, UNIT),), "required", None, True, FORMATS[name])
    source = forced_grammar(setup, None)
    assert walks(compiler, source, CALLS[name].format(ws=" "), smol_tokenizer)
    assert walks(compiler, source, CALLS[name].format(ws="\n  "), smol_tokenizer)
    assert not walks(compiler, source, CALLS[name].format(ws=" " * 40), smol_tokenizer)
    assert not walks(compiler, source, CALLS[name].format(ws="\n" * 12), smol_tokenizer)
