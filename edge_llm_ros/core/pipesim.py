"""A discrete-event simulator of the stage pipeline: the real schedulers and the real stages, with
only time simulated.

Contract: :func:`simulate` runs one request of a :class:`~edge_llm_ros.core.pipeline.Scheduler`
through ``stages`` (core/stages.Stage, computing for real, so tokens, acceptance and pruning are
what the models do) and returns a :class:`Timeline`: when each token was committed, time to first
token, tokens/s, turns. What a step costs comes from a :class:`CostModel`, measured on this machine
or taken from the papers' tables; links add latency plus bytes over bandwidth. Every device is a
server that runs one message at a time, first come first served:

* D0 (the scheduler and its drafter) handles each answer and pays ``draft_s`` per draft forward
  (a tree level) its drafter ran for it;
* stage i runs a message of T rows over a cache of C rows in ``stage_s(i, T, C)``; its answer
  then crosses the link to stage i + 1 (the last stage's to D0);
* a prune crosses the link from D0 to every stage and is applied when it arrives; rows that
  overtook their prune wait for it (``Stage.ready``), as in the nodes.

Knows nothing about ROS.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from .pipeline import Actions, Output, Scheduler
from .stages import Rows, Stage


@dataclass(frozen=True)
class Link:
    """One hop: ``latency_s`` plus ``bytes / bandwidth_bps * 8``."""

    latency_s: float = 0.0
    bandwidth_bps: float = float("inf")

    def seconds(self, nbytes: int) -> float:
        return self.latency_s + nbytes * 8 / self.bandwidth_bps

    def describe(self) -> str:
        rate = "unlimited" if self.bandwidth_bps == float("inf") else f"{self.bandwidth_bps / 1e6:g} Mbit/s"
        return f"{rate}, {self.latency_s * 1e3:g} ms"


@dataclass
class CostModel:
    """What a step costs. ``stage_s(stage, rows, cached)``: one message on one stage;
    ``draft_s``: one draft forward (a tree level, or one token of a chain) on D0;
    ``row_bytes``: one row of hidden states on a link (token ids: 8 bytes a row); ``link``: every
    hop (D0 -> stage 0 -> ... -> last stage -> D0, and D0 -> each stage for prunes)."""

    stage_s: Callable[[int, int, int], float]
    draft_s: float = 0.0
    row_bytes: int = 0
    link: Link = Link()
    prune_bytes: int = 64


@dataclass
class Timeline:
    """One simulated request: the tokens, when each was committed, and the turns."""

    tokens: list[int] = field(default_factory=list)
    times: list[float] = field(default_factory=list)
    turns: int = 0
    rounds: int = 0
    alt: float = 0.0
    alr: float = 0.0
    busy_s: list[float] = field(default_factory=list)  # per stage

    @property
    def ttft_s(self) -> float:
        return self.times[0] if self.times else 0.0

    @property
    def total_s(self) -> float:
        return self.times[-1] if self.times else 0.0

    @property
    def tokens_per_s(self) -> float:
        """Decoding rate: tokens after the first over the time after the first token."""
        span = self.total_s - self.ttft_s
        return (len(self.tokens) - 1) / span if len(self.tokens) > 1 and span > 0 else 0.0


class CountingDrafter:
    """A drafter wrapper that counts draft forwards (tree levels) since the last :meth:`take`."""

    def __init__(self, drafter) -> None:
        self.drafter, self.forwards = drafter, 0

    def propose(self, context, spec, sampler):
        tree = self.drafter.propose(context, spec, sampler)
        self.forwards += max(tree.depth, 1) if len(tree) else 1
        return tree

    def update(self, tree, verification) -> None:
        self.drafter.update(tree, verification)

    def take(self) -> int:
        n, self.forwards = self.forwards, 0
        return n


def simulate(scheduler: Scheduler, stages: Sequence[Stage], costs: CostModel, *,
             max_events: int = 1_000_000) -> Timeline:
    """Run ``scheduler``'s request through ``stages`` with simulated time (see the module docstring).
    The scheduler's drafter, if it has one, should be a :class:`CountingDrafter` for D0's costs."""
    events: list = []  # (time, seq, kind, payload)
    seq = itertools.count()
    queues = [deque() for _ in stages]  # rows waiting at each stage
    free_at = [0.0] * len(stages)
    busy = [0.0] * len(stages)
    d0_free = 0.0
    timeline = Timeline()
    drafter = getattr(scheduler, "drafter", None)

    def push(at: float, kind: str, payload) -> None:
        heapq.heappush(events, (at, next(seq), kind, payload))

    def hop_bytes(rows: Rows, stage: int) -> int:
        return 8 * len(rows) if stage == 0 else costs.row_bytes * len(rows)

    def act(at: float, actions: Actions) -> None:
        """D0 sends what the scheduler decided at ``at`` (prunes first: rows may depend on them)."""
        for prune in actions.prunes:
            for i in range(len(stages)):
                push(at + costs.link.seconds(costs.prune_bytes), "prune", (i, prune))
        for rows in actions.inject:
            push(at + costs.link.seconds(hop_bytes(rows, 0)), "arrive", (0, rows))
        for token in actions.tokens:
            timeline.tokens.append(token)
            timeline.times.append(at)

    def d0(at: float, handle: Callable[[], Actions]) -> None:
        nonlocal d0_free
        start = max(at, d0_free)
        if drafter is not None and hasattr(drafter, "take"):
            drafter.take()
        actions = handle()
        forwards = drafter.take() if drafter is not None and hasattr(drafter, "take") else 0
        d0_free = start + forwards * costs.draft_s
        act(d0_free, actions)

    def try_start(i: int, now: float) -> None:
        """Stage i takes the next rows it can run, if it is idle."""
        while queues[i] and free_at[i] <= now:
            rows = queues[i][0]
            if not stages[i].ready(rows):
                return  # its prune is on the way
            queues[i].popleft()
            rows = stages[i].arrive(rows)
            if rows is None:
                continue
            cached = stages[i].cache_length(rows.request_id)
            out = stages[i].run(rows)
            seconds = costs.stage_s(i, len(rows), cached)
            free_at[i] = now + seconds
            busy[i] += seconds
            push(free_at[i], "done", (i, rows, out))
            return

    d0(0.0, scheduler.start)
    for _ in range(max_events):
        if not events:
            break
        now, _, kind, payload = heapq.heappop(events)
        if kind == "arrive":
            i, rows = payload
            queues[i].append(rows)
            try_start(i, now)
        elif kind == "prune":
            i, prune = payload
            stages[i].prune(prune)
            try_start(i, now)
        elif kind == "done":
            i, rows, out = payload
            if i + 1 < len(stages):
                nxt = Rows(rows.request_id, rows.step, rows.prefix_len, rows.first_row, rows.positions, out,
                           rows.visible, rows.after_prune)
                push(now + costs.link.seconds(hop_bytes(nxt, i + 1)), "arrive", (i + 1, nxt))
            else:
                choices = out.argmax(-1).tolist()
                answer = Output(rows.request_id, rows.step, rows.prefix_len, rows.first_row, choices)
                push(now + costs.link.seconds(8 * len(choices)), "answer", answer)
            try_start(i, now)
        elif kind == "answer":
            d0(now, lambda answer=payload: scheduler.on_output(answer))
            if scheduler.finished:  # what is still in flight no longer matters
                break
    else:
        raise RuntimeError(f"the simulation did not end within {max_events} events")
    for stage in stages:
        stage.release(scheduler.request_id)
    timeline.turns, timeline.rounds = scheduler.turns, scheduler.rounds
    timeline.alt, timeline.alr = scheduler.alt, scheduler.alr
    timeline.busy_s = busy
    return timeline



# -- costs measured on this machine -------------------------------------------------------------------


@dataclass
class LayerProfile:
    """Measured seconds of one decoder layer for ``rows`` new rows over ``cached`` rows (a grid; the
    layers of a model share one shape), and of the final norm + head per row count. What the
    planner (core/partition: t_l and q(x, p)) and the simulator's :class:`CostModel` read."""

    rows: list[int]
    cached: list[int]
    layer_s: list[list[float]]  # [rows][cached]
    head_s: list[float]  # [rows]
    threads: int = 1
    source: str = ""

    def q(self):
        """q(rows, cached) of one layer, interpolated (core/partition.interpolated_cost)."""
        from .partition import interpolated_cost

        return interpolated_cost(self.rows, self.cached, self.layer_s)

    def head(self, rows: int) -> float:
        import numpy as np

        return float(np.interp(rows, self.rows, self.head_s))

    def stage_s(self, ranges: Sequence[range], overhead_s: float = 0.0) -> Callable[[int, int, int], float]:
        """CostModel.stage_s for stages over ``ranges`` (the last one also runs the head)."""
        import numpy as np

        q = self.q()

        def seconds(stage: int, rows: int, cached: int) -> float:
            layer = float(q(np.asarray([rows]), np.asarray([cached]))[0])
            return overhead_s + len(ranges[stage]) * layer + (self.head(rows) if stage == len(ranges) - 1 else 0.0)

        return seconds

    @classmethod
    def measure(cls, model, rows: Sequence[int] = (1, 4, 8, 16, 32, 64), cached: Sequence[int] = (0, 256, 1024),
                repeats: int = 3, layer: int = 0) -> LayerProfile:
        """Time ``model``'s decoder layer ``layer`` (a TorchCausalLM) and its head, with the threads torch
        has now; the median of ``repeats`` after a warm-up."""
        import statistics
        import time

        import torch

        from .models import causal_mask

        def timed(fn) -> float:
            fn()
            times = []
            for _ in range(repeats):
                start = time.perf_counter()
                fn()
                times.append(time.perf_counter() - start)
            return statistics.median(times)

        grid, heads = [], []
        hidden_size = model.config.hidden_size
        with torch.inference_mode():
            for n in rows:
                x = torch.randn(1, n, hidden_size, dtype=model.dtype)
                line = []
                for c in cached:
                    cache = model.new_cache(c + n, range(layer, layer + 1))
                    cache.length = c
                    positions = torch.arange(c, c + n)
                    mask = causal_mask(c, n, model.dtype) if n > 1 else None

                    def run(cache=cache, x=x, positions=positions, mask=mask, c=c):
                        cache.length = c
                        model.run_layers(x, positions, mask, cache, range(layer, layer + 1))

                    line.append(timed(run))
                grid.append(line)
                heads.append(timed(lambda x=x: model.head(x)) if model.lm_head.weight.device.type != "meta" else 0.0)
        return cls(list(rows), list(cached), grid, heads, torch.get_num_threads(),
                   f"measured: {type(model.hf).__name__} layer {layer}, {torch.get_num_threads()} threads")
