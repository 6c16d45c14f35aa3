"""One request's outputs gathered until it finishes: what every front end does with a stream
(`Engine.stream` offline, the engine loop's handle over HTTP)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from strata.engine.request import RequestOutput
from strata.sampler import TokenLogprobs


@dataclass
class Collected:
    token_ids: list[int] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    logprobs: list[TokenLogprobs] = field(default_factory=list)
    final: RequestOutput | None = None  # the last output, once the request has finished

    @property
    def text(self) -> str:
        return "".join(self.texts)

    def add(self, out: RequestOutput) -> bool:
        """Takes one output; True once the request has finished. A request that ended with an
        error (refused, or its step failed) raises that error."""
        if out.error is not None:
            raise out.error
        self.token_ids.extend(out.new_token_ids)
        if out.new_text:
            self.texts.append(out.new_text)
        self.logprobs.extend(out.new_logprobs)
        if out.finished:
            self.final = out
        return out.finished


def collect(outputs: Iterable[RequestOutput], on_text: Callable[[str], None] | None = None) -> Collected:
    """Every output of one request's stream; `on_text` sees each piece of text as it comes."""
    got = Collected()
    for out in outputs:
        done = got.add(out)
        if on_text is not None and out.new_text:
            on_text(out.new_text)
        if done:
            break
    return got
