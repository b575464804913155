"""A discrete-event simulator of the stage pipeline: the real schedulers and the real stages, with
only time simulated.

Contract: :func:`simulate` runs one request of a :class:`~edge_llm_ros.core.pipeline.schedulers.Scheduler`
through ``stages`` (core/pipeline/stages.Stage, computing for real, so tokens, acceptance and pruning are
what the models do) and returns a :class:`Timeline`: when each token was committed, time to first
token, tokens/s, turns. What a step costs comes from a :class:`CostModel`, measured on this machine
or taken from the papers' tables; links add latency plus bytes over bandwidth. Every device is a
server that runs one message at a time, first come first served:

* D0 (the scheduler and its drafter) handles each answer and pays ``draft_call_s`` per draft and
  ``draft_s`` per draft forward (a tree level) its drafter ran for it; when D0 shares a stage's
  core (``d0_shares``), one waits for the other;
* stage i runs a message of T rows over a cache of C rows in ``stage_s(i, T, C)``; its answer
  then crosses the link to stage i + 1 (the last stage's to D0);
* every sender's messages leave on its link in order (runtime/link.py: a token bucket without
  a burst), then take the latency and ``message_s``, the runtime's own cost per message;
* a prune is one message on D0's link to every stage, applied when it arrives; rows that
  overtook their prune wait for it (``Stage.ready``), as in the nodes;
* stages whose cores compute at the same time slow each other (``contention``: a virtual
  machine's cores share their host's): while k stages run, each progresses at
  ``1 / contention ** (k - 1)`` of its own speed, the rest of a running message rescheduled
  whenever one starts or ends (processor sharing). D0's drafting is not counted in k.

Knows nothing about ROS.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ..pipeline.schedulers import Actions, Output, Scheduler, greedy_choices
from ..pipeline.stages import Rows, Stage
from ..planning.costs import CostModel, CountingDrafter


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
    d0_busy_s: float = 0.0  # drafting

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


@dataclass
class _Running:
    """A message a stage is computing, under processor sharing."""

    left_s: float  # its own seconds of work left (what the stage takes alone)
    since: float  # when left_s was brought up to date
    started: float
    rows: Rows
    out: object
    slow: float = 1.0  # seconds taken per own second, now
    token: int = -1  # its current end event's


def simulate(scheduler: Scheduler, stages: Sequence[Stage], costs: CostModel, *,
             max_events: int = 1_000_000) -> Timeline:
    """Run ``scheduler``'s request through ``stages`` with simulated time (see the module docstring).
    The scheduler's drafter, if it has one, should be a :class:`CountingDrafter` for D0's costs."""
    events: list = []  # (time, seq, kind, payload)
    seq = itertools.count()
    queues = [deque() for _ in stages]  # rows waiting at each stage
    free_at = [0.0] * len(stages)
    busy = [0.0] * len(stages)
    running: dict[int, _Running] = {}  # with contention: the message each stage is computing
    tokens = itertools.count()
    left_at: dict = {}  # sender ("d0" or a stage) -> when its link's last byte left
    d0_free = 0.0
    shared = costs.d0_shares
    timeline = Timeline()
    drafter = scheduler.drafter if isinstance(scheduler.drafter, CountingDrafter) else None

    def push(at: float, kind: str, payload) -> None:
        heapq.heappush(events, (at, next(seq), kind, payload))

    def send(sender, at: float, nbytes: int) -> float:
        """When a message ``sender`` hands its link at ``at`` arrives: after the sender's earlier
        messages have left, its own bytes, the latency and the runtime's per-message cost."""
        departure = max(at, left_at.get(sender, 0.0)) + costs.link.serialization_s(nbytes)
        left_at[sender] = departure
        return departure + costs.link.latency_s + costs.message_s

    def hop_bytes(rows: Rows, stage: int) -> int:
        return 8 * len(rows) if stage == 0 else costs.row_bytes * len(rows)

    def act(at: float, actions: Actions) -> None:
        """D0 sends what the scheduler decided at ``at`` (prunes first: rows may depend on them)."""
        for prune in actions.prunes:
            arrival = send("d0", at, costs.prune_bytes)  # one message, every stage subscribes
            for i in range(len(stages)):
                push(arrival, "prune", (i, prune))
        for rows in actions.inject:
            push(send("d0", at, hop_bytes(rows, 0)), "arrive", (0, rows))
        for token in actions.tokens:
            timeline.tokens.append(token)
            timeline.times.append(at)

    def d0(at: float, handle: Callable[[], Actions]) -> None:
        """D0 handles an event: after its earlier work (and the shared stage's, if any), for what
        its drafter ran."""
        nonlocal d0_free
        start = max(at, d0_free, free_at[shared] if shared is not None else 0.0)
        if drafter is not None:
            drafter.take()
        actions = handle()
        calls, forwards = drafter.take() if drafter is not None else (0, 0)
        seconds = calls * costs.draft_call_s + forwards * costs.draft_s
        d0_free = start + seconds
        timeline.d0_busy_s += seconds
        if shared is not None:
            if seconds > 0:
                free_at[shared] = d0_free  # the core is D0's meanwhile
            # the stage looks again once D0 is done, also when D0 only waited: its job may end
            # sooner than D0 was told (processor sharing reschedules it), and rows may be waiting
            push(d0_free, "wake", shared)
        act(d0_free, actions)

    def idle(i: int, now: float) -> bool:
        """Stage i computes nothing now (with processor sharing: no job of its own running; its
        end time moves as the others start and end) and its core is not D0's."""
        computing = i in running if costs.contention != 1.0 else free_at[i] > now
        return not computing and (i != shared or d0_free <= now)

    def try_start(i: int, now: float) -> None:
        """Stage i takes the next rows it can run, if it is idle."""
        while queues[i] and idle(i, now):
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
            if costs.contention == 1.0:
                free_at[i] = now + seconds
                busy[i] += seconds
                push(free_at[i], "done", (i, rows, out, None))
            else:
                share(now, i, _Running(seconds, now, now, rows, out))
            return

    def share(now: float, stage: int, job: _Running | None = None) -> _Running | None:
        """Processor sharing: every running message's work brought up to ``now`` at its old pace,
        ``stage``'s job started (``job``) or ended (None; returned), then every end rescheduled
        at the pace the running count gives from now on."""
        for r in running.values():
            r.left_s, r.since = max(0.0, r.left_s - (now - r.since) / r.slow), now
        ended = running.pop(stage) if job is None else None
        if job is not None:
            running[stage] = job
        slow = costs.contention ** max(len(running) - 1, 0)
        for i, r in running.items():
            r.slow, r.token = slow, next(tokens)
            free_at[i] = now + r.left_s * slow
            push(free_at[i], "done", (i, r.rows, r.out, r.token))
        return ended

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
        elif kind == "wake":
            try_start(payload, now)
        elif kind == "done":
            i, rows, out, token = payload
            if token is not None:
                if i not in running or running[i].token != token:
                    continue  # rescheduled since
                busy[i] += now - share(now, i).started
            if i + 1 < len(stages):
                nxt = dataclasses.replace(rows, data=out, image=None)  # the image is the first stage's
                push(send(i, now, hop_bytes(nxt, i + 1)), "arrive", (i + 1, nxt))
            else:
                choices, probs = greedy_choices(out)
                answer = Output(rows.request_id, rows.step, rows.prefix_len, rows.first_row, choices, probs)
                push(send(i, now, 12 * len(choices)), "answer", answer)
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
