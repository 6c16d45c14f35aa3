"""The two workloads as chat prompts (token ids), 8 distinct prompts each, built from real
text of this repository at run time (nothing is stored here but the instructions).

- repeat: text whose answer repeats its input, where prompt lookup should pay: rewrite a
  40-60 line excerpt of a strata module with one variable renamed (6 prompts), and
  summarise a section of README.md quoting it verbatim (2 prompts);
- chat: open-ended questions whose answers share little with the prompt.

Prompt i of a workload is the same in every arm; 1 lane uses prompt (round mod 8), 8 lanes
use all 8 at once.
"""

from __future__ import annotations

import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXCERPT_LINES = 50
# (module, name renamed, new name): every name occurs in its excerpt (checked)
RENAMES = [
    ("strata/drafting/ngram.py", "tokens", "stream"),
    ("strata/drafting/verify.py", "tokens", "kept"),
    ("strata/drafting/adaptive.py", "alpha", "acceptance"),
    ("strata/stop_match.py", "stops", "stop_list"),
    ("strata/detok.py", "text", "decoded"),
    ("strata/engine/stats.py", "lane", "slot"),
]
SUMMARY_SECTIONS = (1, 2)  # of README.md's "## " sections, 0-based
CHAT = [
    "Tell me about the history of Rome.",
    "What are some good habits for staying healthy?",
    "Explain how a rainbow forms.",
    "Write a short story about a lighthouse keeper.",
    "What should I pack for a week of hiking in the mountains?",
    "Why do cats purr?",
    "Give me some ideas for a birthday party for a ten-year-old.",
    "How do airplanes stay in the air?",
]


def code_excerpt(path: str, lines: int = EXCERPT_LINES) -> str:
    """`lines` lines of `path` from its first import (past the module docstring)."""
    with open(os.path.join(ROOT, path)) as f:
        text = f.read().splitlines()
    start = next(i for i, line in enumerate(text) if line.startswith(("from ", "import ")))
    return "\n".join(text[start : start + lines]).strip()


def readme_section(nth: int) -> str:
    """README.md's `nth` "## " section (0-based), to the next one, at most 40 lines."""
    with open(os.path.join(ROOT, "README.md")) as f:
        text = f.read()
    sections = [p for p in re.split(r"(?m)^(?=## )", text) if p.startswith("## ")]
    return "\n".join(sections[nth].strip().splitlines()[:40])


def repeat_texts() -> list[str]:
    out = []
    for path, old, new in RENAMES:
        code = code_excerpt(path)
        assert re.search(rf"\b{old}\b", code), f"{old!r} is not in the excerpt of {path}"
        out.append(f"Here is some Python code from {path}:\n\n```python\n{code}\n```\n\n"
                   f"Rewrite the whole code with the variable `{old}` renamed to `{new}`. "
                   "Change nothing else and output only the code.")
    for nth in SUMMARY_SECTIONS:
        section = readme_section(nth)
        out.append(f"Here is a section of a project's documentation:\n\n{section}\n\n"
                   "Summarise it in five bullet points. Each bullet quotes one sentence of the text "
                   "word for word, in quotation marks.")
    return out


def workloads(tokenizer, max_prompt: int) -> dict[str, list[list[int]]]:
    """workload -> 8 prompts as token ids, each at most `max_prompt` tokens (checked)."""
    texts = {"repeat": repeat_texts(), "chat": CHAT}
    out = {}
    for name, items in texts.items():
        ids = [tokenizer.encode_chat([{"role": "user", "content": t}]) for t in items]
        too_long = [len(p) for p in ids if len(p) > max_prompt]
        assert not too_long, f"{name} prompts of {too_long} tokens exceed {max_prompt}: shorten the excerpts"
        out[name] = ids
    return out
