"""From a validated request body to what the engine runs: prompt token ids + SamplingParams.

Everything here raises `RequestError` naming the field (a 400); nothing here touches the
engine's mutable state, so it runs off the engine thread (tokenizing and compiling grammars
are thread-safe).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from strata.engine.interface import Prompt, check_prompt
from strata.errors import RequestError
from strata.grammar.compiler import GrammarCompiler
from strata.loader.tokenizer import Tokenizer
from strata.sampling import MAX_LOGPROBS, SamplingParams
from strata.server.answer import AnswerShape
from strata.server.constraints import grammar_of
from strata.server.errors import ModelNotFound
from strata.server.reasoning import reasoning_for
from strata.server.requests import ChatCompletionRequest, CompletionRequest, _Sampling
from strata.server.tools.choice import ToolSetup, check_tools, forced_grammar
from strata.server.tools.parsers import FORMATS, ToolFormat, format_for_template
from strata.server.tools.prompt import check_template_kwargs, with_tools

SEED_MIN, SEED_MAX = -(2**63), 2**64 - 1
DEFAULT_TEMPERATURE = 1.0  # OpenAI's default
MAX_CHOICES = 16
LLAMA_CPP_REPEAT_LAST_N = 64  # llama.cpp's default window for repeat_penalty


@dataclass(frozen=True)
class ModelInfo:
    """What the edge needs to know about the loaded model (immutable after loading)."""

    model_id: str
    tokenizer: Tokenizer
    max_context: int
    vocab_size: int
    fingerprint: str
    tool_call_parser: str = "auto"  # --tool-call-parser
    reasoning_format: str = "auto"  # --reasoning-format
    grammars: GrammarCompiler = field(default=None, compare=False)  # type: ignore[assignment]

    def __post_init__(self) -> None:
        if self.grammars is None:
            tok = self.tokenizer
            object.__setattr__(self, "grammars", GrammarCompiler(tok.backend.to_str(), self.vocab_size,
                                                                 tok.eos_token_ids))

    def tool_format(self) -> ToolFormat:
        if self.tool_call_parser == "auto":
            return format_for_template(self.tokenizer.chat_template)
        return FORMATS[self.tool_call_parser]


@dataclass(frozen=True)
class Job:
    """One generation (n choices of one prompt), ready for the engine loop."""

    prompt: Prompt
    params: SamplingParams  # choice 0's
    stream: bool
    include_usage: bool
    want_logprobs: bool
    n: int = 1
    shape: AnswerShape = AnswerShape()  # how answers are read (reasoning, tool calls)
    tools: ToolSetup | None = None

    def choice_params(self) -> list[SamplingParams]:
        """Each choice's params: seeds seed + i (reduced into the seed's range as the sampler does)."""
        if self.n == 1:
            return [self.params]
        seed = self.params.seed
        return [self.params if seed is None or i == 0 else dataclasses.replace(self.params, seed=seed + i)
                for i in range(self.n)]


def _unsupported(param: str, what: str) -> RequestError:
    return RequestError(
        f"{param}: {what} is not supported by this server",
        code="unsupported_parameter",
        param=param,
    )


def _check_common(req: _Sampling, info: ModelInfo) -> int:
    """Checks what both endpoints share; returns n."""
    if req.model is not None and req.model != info.model_id:
        raise ModelNotFound(req.model, info.model_id)
    n = 1 if req.n is None else req.n
    if not 1 <= n <= MAX_CHOICES:
        raise RequestError(f"n must be between 1 and {MAX_CHOICES}, got {n}", param="n")
    if req.stream_options is not None and not req.stream:
        raise RequestError(
            "stream_options is only allowed when stream is true", param="stream_options"
        )
    if req.seed is not None and not SEED_MIN <= req.seed <= SEED_MAX:
        raise RequestError(
            f"seed must be between {SEED_MIN} and {SEED_MAX}, got {req.seed}", param="seed"
        )
    for token, _ in (req.logit_bias or {}).items():
        if token.strip().isdigit() and int(token) >= info.vocab_size:
            raise RequestError(f"logit_bias: token {token} is not in the vocabulary of {info.vocab_size}",
                               param="logit_bias")
    if req.repetition_penalty is not None and req.repeat_penalty is not None \
            and req.repetition_penalty != req.repeat_penalty:
        raise RequestError("repetition_penalty and repeat_penalty disagree; send one of them",
                           param="repeat_penalty")
    return n


def _check_max_tokens(value: int | None, param: str, info: ModelInfo) -> None:
    # A value no conversation could ever reach is a mistake, not a wish (OpenAI rejects it too).
    if value is not None and value > info.max_context:
        raise RequestError(
            f"{param} must be at most the context length {info.max_context}, got {value}",
            param=param,
        )


def _sampling(
    req: _Sampling, max_tokens: int | None, max_tokens_param: str, logprobs: int | None, grammar: Any = None,
    skip_special: bool = True,
) -> SamplingParams:
    if req.repeat_penalty is not None:  # llama.cpp's: over the last repeat_last_n tokens
        rep, rep_name = req.repeat_penalty, "repeat_penalty"
        last_n = LLAMA_CPP_REPEAT_LAST_N if req.repeat_last_n is None else req.repeat_last_n
    else:
        rep, rep_name, last_n = req.repetition_penalty, "repetition_penalty", req.repeat_last_n
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=DEFAULT_TEMPERATURE if req.temperature is None else req.temperature,
        top_k=0 if req.top_k is None else req.top_k,
        top_p=1.0 if req.top_p is None else req.top_p,
        min_p=0.0 if req.min_p is None else req.min_p,
        seed=req.seed,
        stop=req.stop,
        stop_token_ids=req.stop_token_ids,
        ignore_eos=bool(req.ignore_eos),
        logprobs=logprobs,
        presence_penalty=req.presence_penalty or 0.0,
        frequency_penalty=req.frequency_penalty or 0.0,
        repetition_penalty=1.0 if rep is None else rep,
        repeat_last_n=last_n,
        logit_bias=req.logit_bias,
        min_tokens=req.min_tokens or 0,
        grammar=grammar,
        skip_special_tokens=skip_special if req.skip_special_tokens is None else req.skip_special_tokens,
        # the fields the client actually sent
        field_names={"max_tokens": max_tokens_param, "repetition_penalty": rep_name},
    )


def checked(prompt_ids: list[int], info: ModelInfo, param: str) -> Prompt:
    """The prompt checked once, here at the edge (the engine takes it as it is)."""
    return check_prompt(prompt_ids, info.max_context, info.vocab_size, param)


def chat_job(req: ChatCompletionRequest, info: ModelInfo) -> Job:
    n = _check_common(req, info)
    if (
        req.max_tokens is not None
        and req.max_completion_tokens is not None
        and req.max_tokens != req.max_completion_tokens
    ):
        raise RequestError(
            "max_tokens and max_completion_tokens disagree; send one of them",
            param="max_completion_tokens",
        )
    param = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
    max_tokens = (
        req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    )
    _check_max_tokens(max_tokens, param, info)
    if req.top_logprobs is not None and not req.logprobs:
        raise RequestError("top_logprobs needs logprobs to be true", param="top_logprobs")
    if req.top_logprobs is not None and not 0 <= req.top_logprobs <= MAX_LOGPROBS:
        raise RequestError(
            f"top_logprobs must be between 0 and {MAX_LOGPROBS}, got {req.top_logprobs}",
            param="top_logprobs",
        )
    if req.store:
        raise _unsupported("store", "storing completions")
    messages: list[dict[str, Any]] = [m.model_dump(exclude_none=True) for m in req.messages]
    fmt = info.tool_format()
    tools = check_tools(req.tools, req.tool_choice, req.parallel_tool_calls, fmt)
    grammar = grammar_of(req, info.grammars)
    if tools is not None and tools.forced:
        if grammar is not None:
            raise RequestError("tool_choice: a forced tool call and a response format cannot both hold the answer",
                               param="tool_choice")
        grammar = info.grammars.compile("lark", forced_grammar(tools, _special_id(info, fmt)), "tools")
    kwargs = check_template_kwargs(req.chat_template_kwargs)
    prompt, text = chat_prompt(messages, tools, kwargs, info)
    logprobs = (req.top_logprobs or 0) if req.logprobs else None
    params = _sampling(req, max_tokens, param, logprobs, grammar,
                       skip_special=not (tools is not None and fmt.special_markers))
    shape = answer_shape(info, text, tools)
    return Job(prompt, params, bool(req.stream), _include_usage(req), logprobs is not None, n, shape, tools)


def chat_text(messages: list[dict[str, Any]], tools: ToolSetup | None, kwargs: dict[str, Any],
              info: ModelInfo, add_generation_prompt: bool = True) -> tuple[list[int], str]:
    """The token ids and text of a conversation with its tools, through the chat template."""
    shown, extra = with_tools(messages, tools, info.tokenizer.chat_template)
    text = info.tokenizer.render_chat(shown, add_generation_prompt, **extra, **kwargs)
    ids = info.tokenizer.encode(text, add_special_tokens=False)
    tok = info.tokenizer
    if tok.add_bos and ids[:1] != [tok.bos_token_id]:
        ids.insert(0, tok.bos_token_id)
    return ids, text


def chat_prompt(messages: list[dict[str, Any]], tools: ToolSetup | None, kwargs: dict[str, Any],
                info: ModelInfo, param: str = "messages") -> tuple[Prompt, str]:
    """The checked prompt of a conversation with its tools, and its text (where reasoning starts)."""
    ids, text = chat_text(messages, tools, kwargs, info)
    return checked(ids, info, param), text


def answer_shape(info: ModelInfo, prompt_text: str, tools: ToolSetup | None) -> AnswerShape:
    reasoning = None
    if info.reasoning_format == "auto":
        reasoning = reasoning_for(info.tokenizer.chat_template, prompt_text)
    return AnswerShape(reasoning, tools.fmt if tools is not None else None,
                       tools.parallel if tools is not None else True)


def _special_id(info: ModelInfo, fmt: ToolFormat) -> int | None:
    if not fmt.special_markers:
        return None
    token_id = info.tokenizer.token_to_id(fmt.start)
    return token_id if token_id is not None and info.tokenizer.is_special(token_id) else None


def completion_job(req: CompletionRequest, info: ModelInfo) -> Job:
    n = _check_common(req, info)
    _check_max_tokens(req.max_tokens, "max_tokens", info)
    if req.echo:
        raise _unsupported("echo", "echoing the prompt")
    if req.suffix:
        raise _unsupported("suffix", "a suffix (fill-in-the-middle)")
    if req.best_of not in (None, 1, n):
        raise _unsupported("best_of", f"best_of={req.best_of} (ranking choices; n choices are all returned)")
    if req.logprobs is not None and not 0 <= req.logprobs <= MAX_LOGPROBS:
        raise RequestError(
            f"logprobs must be between 0 and {MAX_LOGPROBS}, got {req.logprobs}", param="logprobs"
        )
    grammar = grammar_of(req, info.grammars)
    params = _sampling(req, req.max_tokens, "max_tokens", req.logprobs, grammar)
    prompt = checked(_prompt_ids(req.prompt, info), info, "prompt")
    return Job(prompt, params, bool(req.stream), _include_usage(req), req.logprobs is not None, n)


def _prompt_ids(prompt: str | list, info: ModelInfo) -> list[int]:
    if isinstance(prompt, str):
        return info.tokenizer.encode(prompt)
    if prompt and not isinstance(prompt[0], int):  # a batch of prompts
        if len(prompt) != 1:
            raise _unsupported(
                "prompt", f"a batch of {len(prompt)} prompts (send one prompt per request)"
            )
        return _prompt_ids(prompt[0], info)
    return list(prompt)


def _include_usage(req: _Sampling) -> bool:
    return bool(req.stream_options is not None and req.stream_options.include_usage)
