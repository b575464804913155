"""Outline decoding (Jupiter §V-B): an outline first, then its points expanded as concurrent
requests that share the outline request's KV cache, concatenated.

NOT LOSSLESS, by design: the answer is not the target's plain greedy answer to the question; it is
the target's greedy answers to other prompts (the outline prompt, then "expand point i"), joined.
Every table and stat labels it so and keeps it out of lossless comparisons. It is a per-request
switch (mode ``outline``), for questions that list things; not for code or math (Jupiter: tasks
with chained reasoning lose quality), and a question whose outline has fewer than two points is
answered plainly instead (the caller's lossless mode).

Contract: :class:`Outline` builds the schedulers (core/pipeline/schedulers.py) and knows nothing about how
they run. ``first()`` is the outline request. Once it has ended, ``expand()`` returns one request
per point; each forks the outline request's cache (every committed row the stages hold) and
prefills only its own rows, so the pipeline's stages work on all points at once. ``text()``
joins the expansions. Knows nothing about ROS.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from .schedulers import Scheduler

OUTLINE_ASK = "First give only an outline of the answer: {points} short numbered points, a few words each."
EXPAND_ASK = "Expand point {number} ({point}) in one or two sentences."
_NUMBER = re.compile(r"(?:^|(?<=\s))(\d+)[.)]\s+")
_BULLET = re.compile(r"^\s*[-*•]\s+(.+?)\s*$", re.MULTILINE)
_MARKER = "\x00outline\x00"


def parse_points(text: str, most: int) -> list[str]:
    """The outline's points, at most ``most``: numbered 1., 2., ... (or 1), 2) ...) in order, on lines
    of their own or one after another in a line, else lines bulleted '-', '*'. A point is its title:
    up to the first ':', '.' or line end, markdown emphasis dropped ("1. **Safety**: check ..." ->
    "Safety"); an outline cut off by its token limit keeps the points it began."""
    starts = []
    for match in _NUMBER.finditer(text):
        if int(match[1]) == len(starts) + 1:
            starts.append(match)
    bodies = [text[m.end(): starts[i + 1].start() if i + 1 < len(starts) else len(text)] for i, m in enumerate(starts)]
    if not bodies:
        bodies = _BULLET.findall(text)
    titles = [re.split(r"[:.\n]", body.replace("**", "").replace("__", ""), maxsplit=1)[0].strip() for body in bodies]
    return [t for t in titles if t][:most]


def chat_ids(tokenizer, messages: list[dict], generation_prompt: bool = True) -> list[int]:
    from ..engine.models import encode

    return encode(tokenizer, tokenizer.apply_chat_template(messages, tokenize=False,
                                                          add_generation_prompt=generation_prompt))


def follow_up_ids(tokenizer, first_user: str, follow_up: str) -> list[int]:
    """The chat template's tokens between the assistant's first answer and the start of its second:
    end of that answer, the user's ``follow_up`` turn, the assistant's header."""
    full = tokenizer.apply_chat_template([{"role": "user", "content": first_user},
                                          {"role": "assistant", "content": _MARKER},
                                          {"role": "user", "content": follow_up}],
                                         tokenize=False, add_generation_prompt=True)
    from ..engine.models import encode

    return encode(tokenizer, full.split(_MARKER, 1)[1])


class Outline:
    """One outline request and its point requests. ``make(request_id, prompt, max_new_tokens,
    fork_from, cached)`` returns a scheduler (the caller's mode: ar or flowspec)."""

    def __init__(self, request_id: str, tokenizer, question: str, make: Callable[..., Scheduler], *,
                 points: int = 4, outline_tokens: int = 48, point_tokens: int = 48, eos=()) -> None:
        self.request_id, self.tokenizer, self.question, self.make = request_id, tokenizer, question, make
        self.points_wanted, self.outline_tokens, self.point_tokens = points, outline_tokens, point_tokens
        self.eos = tuple(eos)
        self.ask = f"{question}\n\n{OUTLINE_ASK.format(points=points)}"
        self.outline: Scheduler | None = None
        self.points: list[str] = []
        self.expansions: list[Scheduler] = []

    def first(self) -> Scheduler:
        self.outline = self.make(f"{self.request_id}-outline", chat_ids(self.tokenizer, [
            {"role": "user", "content": self.ask}]), self.outline_tokens)
        return self.outline

    def outline_text(self) -> str:
        return self.tokenizer.decode(self.outline.generated, skip_special_tokens=True)

    def expand(self) -> list[Scheduler]:
        """A request per point of the finished outline ([] for fewer than two: answer plainly)."""
        self.points = parse_points(self.outline_text(), self.points_wanted)
        if len(self.points) < 2:
            return []
        context = list(self.outline.context)
        if context[-1] in self.eos:  # the template's follow-up starts with the end of the answer itself
            context.pop()
        shared = min(self.outline.committed_in_cache, len(context) - 1)
        self.expansions = [
            self.make(f"{self.request_id}-point{i + 1}",
                      context + follow_up_ids(self.tokenizer, self.ask, EXPAND_ASK.format(number=i + 1, point=p)),
                      self.point_tokens, fork_from=self.outline.request_id, cached=shared)
            for i, p in enumerate(self.points)]
        return self.expansions

    def tokens(self) -> list[int]:
        """The points' tokens, in order (end-of-answer tokens dropped between them)."""
        return [t for s in self.expansions for t in s.generated if t not in self.eos]

    def point_text(self, index: int) -> str:
        """Point ``index``'s expansion as "N. text" (a number the model put first itself dropped)."""
        text = self.tokenizer.decode(self.expansions[index].generated, skip_special_tokens=True).strip()
        return f"{index + 1}. {_NUMBER.sub('', text, count=1) if _NUMBER.match(text) else text}"

    def text(self) -> str:
        return "\n".join(self.point_text(i) for i in range(len(self.expansions)))
