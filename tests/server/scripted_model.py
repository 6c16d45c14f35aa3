"""A tiny Llama whose greedy answer to any chat is a fixed text: a real model served by the
real server, used where a test needs to know what the model will say (hostile HTML).

Every layer's output projections (attention `o_proj`, MLP `down_proj`) are zero, so the
residual stream after the last layer is the input embedding: the logits depend on the last
token only (a bigram table). The chat template's last token ("\\n" after "assistant") and
each token of the script get their own one-hot embedding direction e_k, and `lm_head` maps
e_k to the script's next token (the last one to end-of-sequence): logit 8 x 10 = 80 against
0 for every other token, so any temperature below ~5 says the script.
"""

from __future__ import annotations

import os

from tests.conftest import make_tiny_model, require

LOGIT = 10.0


def make_scripted_model(out_dir: str, tokenizer, text: str) -> str:
    """A Hugging Face directory whose answer to every chat is `text` then end-of-sequence."""
    safetensors_torch = require("safetensors.torch")
    script = tokenizer.encode(text, add_special_tokens=False)
    after_header = tokenizer.encode("\n", add_special_tokens=False)
    assert len(after_header) == 1 and tokenizer.render_chat([{"role": "user", "content": "x"}], True).endswith("\n")
    chain = after_header + script
    if len(set(chain)) != len(chain):
        raise ValueError(f"every token of the script must differ (and differ from '\\n'): {chain}")
    make_tiny_model("llama", out_dir, tokenizer)
    path = os.path.join(out_dir, "model.safetensors")
    weights = safetensors_torch.load_file(path)
    hidden = weights["model.embed_tokens.weight"].shape[1]
    assert len(chain) <= hidden, "one embedding direction per token of the script"
    for name, tensor in weights.items():
        if name.endswith(("o_proj.weight", "down_proj.weight")):
            tensor.zero_()
        if name.endswith("norm.weight"):
            tensor.fill_(1.0)
    embed, head = weights["model.embed_tokens.weight"], weights["lm_head.weight"]
    embed.zero_()
    head.zero_()
    eos = tokenizer.eos_token_ids[0]
    for k, (token, following) in enumerate(zip(chain, [*script, eos])):
        embed[token, k] = 1.0
        head[following, k] = LOGIT
    safetensors_torch.save_file(weights, path, metadata={"format": "pt"})
    return out_dir

