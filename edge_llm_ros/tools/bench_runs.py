"""One prompt through one runner, timed: the engine scenario's generations (``tools/bench.py``).

    run_engine     our engine (core.engine.decoding.generate), counting its rounds and times
    run_hf         transformers ``generate`` on the target's HF model, plain or assisted by a draft;
                   its target and draft passes counted and timed with forward hooks
    run_llama_cpp  llama.cpp's own greedy generation (``Llama.generate``): what a llama_ros user gets

Each returns a :class:`Run`: the new tokens, wall time, time to first token, target passes,
drafted and accepted counts, and the draft and verify times where they can be observed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch

from edge_llm_ros.core.engine.config import GenerationConfig, GenerationStats
from edge_llm_ros.core.engine.decoding import generate
from edge_llm_ros.tools.loading import HFAssist


@dataclass
class Run:
    """One prompt through one runner."""

    tokens: list[int]
    wall_s: float
    ttft_s: float
    passes: int  # target forward passes after prefill (verification rounds; HF: every target call)
    accepted: int  # drafted tokens the target accepted
    drafted: int | None  # drafted tokens verified (None: not observable)
    draft_time_s: float | None
    verify_time_s: float | None


def run_engine(target, ids: list[int], config: GenerationConfig, drafter) -> Run:
    """Our engine on ``ids`` with ``config`` and ``drafter`` (None for ar)."""
    stats = GenerationStats()
    tokens, first = [], None
    start = time.perf_counter()
    for token in generate(target, ids, config, drafter, stats):
        if first is None:
            first = time.perf_counter() - start
        tokens.append(token)
    wall = time.perf_counter() - start
    return Run(tokens, wall, first if first is not None else wall, stats.rounds, sum(stats.accepted),
               stats.drafted, stats.draft_time_s, stats.verify_time_s)


class ForwardMeter:
    """Counts and times a module's forward calls with hooks (installed only while in use)."""

    def __init__(self, module: torch.nn.Module | None) -> None:
        self.module, self.calls, self.seconds, self._t0, self._handles = module, 0, 0.0, 0.0, []

    def __enter__(self) -> ForwardMeter:
        if self.module is not None:
            self._handles = [
                self.module.register_forward_pre_hook(self._pre),
                self.module.register_forward_hook(self._post),
            ]
        return self

    def __exit__(self, *exc) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []

    def _pre(self, *_):
        self._t0 = time.perf_counter()

    def _post(self, *_):
        self.calls += 1
        self.seconds += time.perf_counter() - self._t0


class FirstTokenTimer:
    """A transformers streamer that only notes when the first new token arrives."""

    def __init__(self) -> None:
        self.puts, self.first = 0, None

    def put(self, value) -> None:
        self.puts += 1
        if self.puts == 2 and self.first is None:  # put #1 is the prompt
            self.first = time.perf_counter()

    def end(self) -> None:
        pass


def run_hf(target, ids: list[int], max_new_tokens: int, eos: int | None, sampling: dict | None, seed: int,
           assist: HFAssist | None = None) -> Run:
    """transformers ``generate`` on the target's HF model (plain, or assisted by ``assist``)."""
    x = torch.tensor([ids])
    kwargs: dict[str, Any] = dict(attention_mask=torch.ones_like(x), max_new_tokens=max_new_tokens,
                                  pad_token_id=eos if eos is not None else 0, eos_token_id=eos)
    if sampling is None:
        kwargs.update(do_sample=False, temperature=None, top_k=None, top_p=None)
    else:
        kwargs.update(do_sample=True, **sampling)
        torch.manual_seed(seed)
    if assist is not None:
        kwargs.update(assist.kwargs)
    timer = FirstTokenTimer()
    with ForwardMeter(target.hf) as verify_meter, ForwardMeter(assist.assistant if assist else None) as draft_meter:
        start = time.perf_counter()
        with torch.inference_mode():
            out = target.hf.generate(x, streamer=timer, **kwargs)
        wall = time.perf_counter() - start
    tokens = out[0, len(ids):].tolist()
    ttft = timer.first - start if timer.first is not None else wall
    passes = max(verify_meter.calls, 1)
    has_model = assist is not None and assist.assistant is not None
    return Run(tokens, wall, ttft, passes, max(len(tokens) - passes, 0),
               draft_meter.calls if has_model else (None if assist else 0),
               draft_meter.seconds if has_model else (None if assist else 0.0), verify_meter.seconds)


def run_llama_cpp(llm, ids: list[int], max_new_tokens: int, eos: int | None) -> Run:
    """llama.cpp's own greedy generation (``Llama.generate``), the prompt evaluated afresh."""
    llm.reset()
    tokens, first = [], None
    start = time.perf_counter()
    for token in llm.generate(ids, top_k=1, temp=0.0, reset=True):
        if first is None:
            first = time.perf_counter() - start
        tokens.append(int(token))
        if len(tokens) >= max_new_tokens or token == eos:
            break
    wall = time.perf_counter() - start
    return Run(tokens, wall, first if first is not None else wall, len(tokens), 0, 0, 0.0, None)
