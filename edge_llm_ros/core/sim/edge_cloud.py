"""A discrete-event simulator of edge-cloud decoding (modes ``ar``, ``sd``, ``tree``, ``fsd``, ``ee``):
the real robot and server, with only time simulated.

Contract: :func:`simulate_edge_cloud` runs one request through an :class:`EarlyExitDrafter` (EE
Algorithm 1, driven by :func:`robot_rounds` as draft_node drives it) and an
:class:`EarlyExitVerifier` (EE Algorithm 2), both computing for real, so tokens, acceptance, early
outcomes, pre-draft hits and misses and drafts sent ahead are the models'. It returns an
:class:`EdgeCloudTimeline` (each token's commit time, TTFT, tokens/s, the robot's stats, busy
times). Durations come from an :class:`EdgeCloudCosts`, never from a clock: greedy runs are
deterministic. Knows nothing about ROS. The model (launch/edge_cloud.launch.py, one request):

* server: one draft at a time, first come first served (a cloud request's next round queues
  behind what waits); a round costs ``round_s``, every target layer over its rows (round 0
  prefills the prompt first), each exit's head as its layer is passed, the final norm + head. An
  early outcome leaves when its exit is done, the final at the end; a speculative draft whose
  assumption failed is dropped at no cost;
* robot: the request's thread drafts round 0 and, on each final, the next draft (a miss, or a
  still queued pre-draft drafted inline) or waits for a pre-draft being drafted; ``workers``
  pre-draft workers take the most confident queued hypothesis when free, and in ``ee`` a finished
  one goes up at once. A draft costs ``draft_call_s`` + ``draft_s`` per forward (a tree level, a
  chain token) on one of the robot's drafters, one draft at a time each
  (:class:`SimulatedPreDraftCache`: PreDraftCache's rules on simulated time);
* cores: with ``cores`` set, server rounds and robot drafts share that many cores (the bench's two
  processes on one machine): a task runs on the core where it can start first, never on top of
  work placed before it (no time slicing); None: a core per thread;
* links: drafts go up on ``uplink``, outcomes down on ``downlink`` (core.planning.costs.Link: latency + bytes
  over bandwidth, in send order; bytes from msg/DraftTree.msg and msg/VerifyResult.msg), plus
  ``message_s`` each. Publishers never block (runtime/link.py), so the verifier's send queue
  drains at once and outcomes queue in the link in the order made;
* a token is committed when the robot's thread has handled its final (and made the next draft),
  where draft_node yields it; receiving and bookkeeping cost nothing.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
from bisect import insort
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from ..edge_cloud.predraft import CacheKey, PreDraft, discard_jobs
from ..edge_cloud.records import DraftRequest, SpeculationMissed, VerifyOutcome, draft_bytes, outcome_bytes
from ..edge_cloud.robot import EarlyExitDrafter, EdgeCloudStats, robot_rounds
from ..edge_cloud.server import EarlyExitVerifier
from ..engine.config import GenerationConfig
from ..engine.decoding import draft_step
from ..engine.drafters import Drafter, TreeSpec
from ..engine.sampling import Sampler, make_generator
from ..engine.tree import TokenTree
from ..planning.costs import CountingDrafter, DraftCost, LayerProfile, Link
from .pipeline import Timeline


def no_cost(rows: int) -> float:
    return 0.0


@dataclass
class EdgeCloudCosts:
    """What a step costs, in seconds.

    Server: ``layer_s(layer, rows, cached)`` one target layer over ``rows`` new rows with
    ``cached`` rows in its cache; ``exit_s(rows)`` one exit (adapter + head) over a round's tree
    rows; ``head_s(rows)`` the final norm + head over them; ``round_s`` the verifier's own cost per
    round (tree rows, masks, records). Robot: ``draft_s`` per draft forward, ``draft_call_s`` per
    draft. ``uplink`` / ``downlink``: the link each way; ``message_s``: what the runtime adds to
    every message besides the link. ``cores``: cores shared by the server's and the robot's
    compute (None: a core per thread)."""

    layer_s: Callable[[int, int, int], float]
    exit_s: Callable[[int], float] = no_cost
    head_s: Callable[[int], float] = no_cost
    round_s: float = 0.0
    draft_s: float = 0.0
    draft_call_s: float = 0.0
    uplink: Link = Link()
    downlink: Link = Link()
    message_s: float = 0.0
    cores: int | None = None

    @classmethod
    def measured(cls, profile: LayerProfile, draft: DraftCost, uplink: Link, downlink: Link,
                 **rest) -> EdgeCloudCosts:
        """From measurements: every layer and the head from ``profile`` (an exit costs a head
        unless ``exit_s`` is given), drafting from ``draft`` (DraftCost.fit over a TimedDrafter's
        log); ``rest``: the other fields."""
        q = profile.q()

        def layer_s(layer: int, rows: int, cached: int) -> float:
            return float(q([rows], [cached])[0])

        rest.setdefault("exit_s", profile.head)
        return cls(layer_s, head_s=profile.head, draft_s=draft.per_forward_s, draft_call_s=draft.per_draft_s,
                   uplink=uplink, downlink=downlink, **rest)

    @classmethod
    def tabled(cls, verify_s: Callable[[int], float], layers: int, head_layers: float, draft_s: float,
               link: Link) -> EdgeCloudCosts:
        """A paper's deployment: ``verify_s(rows)`` a verification of ``rows`` tree rows on its server,
        shared by ``layers`` decoder layers and a head that weighs ``head_layers`` of them (an
        exit's head as much, on top), whatever the cache holds; a prompt's prefill costs the
        layers' share of ``verify_s`` of its rows once more; ``draft_s`` a draft forward; ``link`` each way."""
        share = 1.0 / (layers + head_layers)

        def layer_s(layer: int, rows: int, cached: int) -> float:
            return share * verify_s(rows)

        def head_s(rows: int) -> float:
            return head_layers * share * verify_s(rows)

        return cls(layer_s, exit_s=head_s, head_s=head_s, draft_s=draft_s, uplink=link, downlink=link)

    def server_scaled(self, factor: Callable[[int], float]) -> EdgeCloudCosts:
        """The same costs with the server's layers, exits and head over ``rows`` rows ``factor(rows)``
        times as long (a whole forward as the deployed verifier times it, over what the per-layer
        costs add up to)."""
        layer_s, exit_s, head_s = self.layer_s, self.exit_s, self.head_s
        return replace(self, layer_s=lambda layer, rows, cached: factor(rows) * layer_s(layer, rows, cached),
                       exit_s=lambda rows: factor(rows) * exit_s(rows), head_s=lambda rows: factor(rows) * head_s(rows))

    def verification(self, draft: DraftRequest, layers: Sequence[int],
                     exits: Sequence[int]) -> tuple[dict[int, float], float]:
        """Seconds from the start of ``draft``'s round until each exit's outcome, and the final one."""
        prefill, pending, cached = _rows(draft)
        tree_rows = len(draft.token_ids) + 1
        seconds = self.round_s + (sum(self.layer_s(layer, prefill, 0) for layer in layers) if prefill else 0.0)
        ready = {}
        for layer in layers:
            seconds += self.layer_s(layer, pending + tree_rows, cached)
            if layer in exits:
                seconds += self.exit_s(tree_rows)
                ready[layer] = seconds
        return ready, seconds + self.head_s(tree_rows)


def _rows(draft: DraftRequest) -> tuple[int, int, int]:
    """(prompt rows prefilled first, context rows fed before the tree, rows cached before them), as
    EarlyExitVerifier._admit and _tree_rows: round 0 caches the prompt but its last token (the
    root); a later round feeds its context_ids after the committed tokens."""
    if draft.round == 0:
        return draft.prefix_len - 1, 0, draft.prefix_len - 1
    pending = len(draft.context_ids)
    return 0, pending, draft.prefix_len - 1 - pending


class _Events:
    """The simulated clock: handlers run in time order (ties: the order they were scheduled)."""

    def __init__(self, max_events: int) -> None:
        self.now, self.left = 0.0, max_events
        self._heap: list = []
        self._seq = itertools.count()

    def at(self, time: float, handler: Callable, *args) -> None:
        heapq.heappush(self._heap, (time, next(self._seq), handler, args))

    def step(self) -> bool:
        """Run the next handler; False when none is left."""
        if not self._heap:
            return False
        if self.left <= 0:
            raise RuntimeError("the simulation did not end within its max_events")
        self.left -= 1
        self.now, _, handler, args = heapq.heappop(self._heap)
        handler(*args)
        return True


class Cores:
    """``count`` cores shared by every task (None: each task's thread has a core of its own). A task
    runs on the core where it can start first at or after it is ready, in a gap between the tasks
    placed before it if it fits, else after them."""

    def __init__(self, count: int | None) -> None:
        if count is not None and count < 1:
            raise ValueError(f"cores must be >= 1 or None, got {count}")
        self.count = count
        self._busy: list[list[tuple[float, float]]] = [[] for _ in range(count or 0)]  # per core, sorted

    def place(self, ready: float, seconds: float) -> float:
        """Reserve ``seconds`` of a core from ``ready`` on; returns when the task starts."""
        if self.count is None:
            return ready
        start, core = min((self._fit(slots, ready, seconds), i) for i, slots in enumerate(self._busy))
        insort(self._busy[core], (start, start + seconds))
        return start

    @staticmethod
    def _fit(slots: list[tuple[float, float]], ready: float, seconds: float) -> float:
        start = ready
        for begin, end in slots:
            if start + seconds <= begin:
                break
            start = max(start, end)
        return start


@dataclass(eq=False)
class _Job:
    key: CacheKey
    spec: TreeSpec
    warp: tuple[float, int, float]  # temperature, top_k, top_p of the request's sampler
    confidence: float
    exit_layer: int
    on_ready: Callable[[CacheKey], None] | None
    state: str = "queued"  # queued -> running -> done, or cancelled
    tree: TokenTree | None = None
    start: float = 0.0
    end: float = 0.0


class SimulatedPreDraftCache:
    """PreDraftCache's interface and rules (predraft.py) on simulated time, no threads: a pre-draft
    is drafted when a worker takes it but is ready only at its simulated end. ``now`` is the time of
    the thread calling in; :meth:`draft_now` and waiting in :meth:`take` advance it, as they block
    the real caller. ``take`` at ``now``: a done pre-draft at once, a running one after waiting for
    its end, a queued one drafted inline."""

    def __init__(self, drafters: Sequence[Drafter], seed: int | None, workers: int, costs: EdgeCloudCosts,
                 cores: Cores, events: _Events) -> None:
        self.now, self.busy_s = 0.0, 0.0
        self.workers, self.costs, self.cores, self.events = workers, costs, cores, events
        self._drafters = [CountingDrafter(d) for d in drafters]
        self._generators = [make_generator(None if seed is None else seed + i) for i in range(len(drafters))]
        self._free_at = [0.0] * len(drafters)
        self._queue: list[tuple[float, int, _Job]] = []
        self._jobs: dict[CacheKey, _Job] = {}
        self._seq = itertools.count()
        self._running = 0

    def __contains__(self, key: CacheKey) -> bool:
        return key in self._jobs

    def schedule(self, key: CacheKey, spec: TreeSpec, sampler: Sampler, confidence: float, exit_layer: int,
                 on_ready: Callable[[CacheKey], None] | None = None) -> bool:
        if key in self._jobs:
            return False
        job = _Job(key, spec, (sampler.temperature, sampler.top_k, sampler.top_p), confidence, exit_layer, on_ready)
        self._jobs[key] = job
        heapq.heappush(self._queue, (-confidence, next(self._seq), job))
        self._dispatch()
        return True

    def take(self, key: CacheKey) -> PreDraft | None:
        job = self._jobs.pop(key, None)
        if job is None:
            return None
        if job.state == "queued":
            job.state = "cancelled"
            tree, seconds = self.draft_now(list(key[2]), job.spec, Sampler(*job.warp))
            return PreDraft(tree, job.exit_layer, job.confidence, seconds, seconds, False, True)
        ready, wait = job.state == "done", max(0.0, job.end - self.now)
        self.now += wait
        return PreDraft(job.tree, job.exit_layer, job.confidence, job.end - job.start, wait, ready, False)

    def discard(self, request_id: str, round: int | None = None) -> tuple[int, int]:
        return discard_jobs(self._jobs, request_id, round)

    def draft_now(self, context: list[int], spec: TreeSpec, sampler: Sampler) -> tuple[TokenTree, float]:
        """Draft on the calling thread: (tree, seconds from ``now`` to its end, waiting included)."""
        tree, _, end = self._draft(context, spec, (sampler.temperature, sampler.top_k, sampler.top_p))
        waited, self.now = end - self.now, end
        return tree, waited

    def _draft(self, context: list[int], spec: TreeSpec, warp: tuple) -> tuple[TokenTree, float, float]:
        """Draft on the drafter free first, after its earlier drafts, on a core: (tree, start, end)."""
        i = min(range(len(self._drafters)), key=self._free_at.__getitem__)
        tree = draft_step(self._drafters[i], context, spec, Sampler(*warp, self._generators[i]))
        calls, forwards = self._drafters[i].take()
        seconds = calls * self.costs.draft_call_s + forwards * self.costs.draft_s
        start = self.cores.place(max(self.now, self._free_at[i]), seconds)
        self._free_at[i] = start + seconds
        self.busy_s += seconds
        return tree, start, start + seconds

    def _dispatch(self) -> None:
        """Free workers take the most confident queued pre-drafts (PreDraftCache._work)."""
        while self._running < self.workers and self._queue:
            job = heapq.heappop(self._queue)[-1]
            if job.state != "queued":
                continue
            job.state = "running"
            self._running += 1
            job.tree, job.start, job.end = self._draft(list(job.key[2]), job.spec, job.warp)
            self.events.at(job.end, self._finish, job)

    def _finish(self, job: _Job) -> None:
        """A worker's pre-draft is done: its ``on_ready`` (send-ahead) runs then, on the worker."""
        job.state = "done"
        self._running -= 1
        self.now = job.end
        if job.on_ready is not None:
            job.on_ready(job.key)
        self._dispatch()


@dataclass
class EdgeCloudTimeline(Timeline):
    """One simulated edge-cloud request: core/sim/pipeline's Timeline (``busy_s``: [the server's],
    ``d0_busy_s``: the robot's drafting) and the robot's stats (τ, hits, misses, drafts sent ahead)."""

    stats: EdgeCloudStats = field(default_factory=EdgeCloudStats)

    @property
    def server_busy_s(self) -> float:
        return self.busy_s[0] if self.busy_s else 0.0


class _Run:
    """Both halves of one simulated request: the server's queue, the links, the robot's inbox."""

    def __init__(self, verifier: EarlyExitVerifier, drafter: EarlyExitDrafter, costs: EdgeCloudCosts,
                 max_events: int, own_drafters: Sequence[Drafter] = ()) -> None:
        self.verifier, self.drafter, self.costs = verifier, drafter, costs
        self.events, self.cores = _Events(max_events), Cores(costs.cores)
        drafters, workers = (own_drafters, 1) if own_drafters else (drafter.drafters, drafter.cache.workers)
        self.cache = SimulatedPreDraftCache(drafters, drafter.cache.seed, workers, costs, self.cores, self.events)
        self.left_at = {"up": 0.0, "down": 0.0}  # when each link's last byte left
        self.waiting: deque[DraftRequest] = deque()  # drafts at the server
        self.finals: deque[tuple[float, VerifyOutcome]] = deque()  # arrived at the robot
        self.verifying, self.server_busy_s = False, 0.0

    # -- the robot: its request thread at ``cache.now``, its receiver at the arrival time -----------

    def send(self, draft: DraftRequest) -> None:
        """robot_rounds' send and the drafter's sender (ee): the draft goes up now."""
        self.events.at(self.cache.now, self._up, draft)

    def await_final(self) -> VerifyOutcome:
        """robot_rounds' await_final: run the clock until a final outcome has arrived."""
        free = self.cache.now  # the request's thread waits from here
        while not self.finals:
            if not self.events.step():
                raise RuntimeError("nothing left to simulate and no final outcome arrived")
        arrived, final = self.finals.popleft()
        self.cache.now = max(free, arrived)
        return final

    def _receive(self, outcome: VerifyOutcome) -> None:
        if outcome.final:
            self.finals.append((self.events.now, outcome))
        else:
            self.cache.now = self.events.now
            self.drafter.on_early(outcome)

    # -- the links ----------------------------------------------------------------------------------

    def _arrival(self, direction: str, link: Link, nbytes: int) -> float:
        """core/sim/pipeline's send: after the earlier messages' bytes, its own, the latency and message_s."""
        departure = max(self.events.now, self.left_at[direction]) + link.serialization_s(nbytes)
        self.left_at[direction] = departure
        return departure + link.latency_s + self.costs.message_s

    def _up(self, draft: DraftRequest) -> None:
        self.events.at(self._arrival("up", self.costs.uplink, draft_bytes(draft)), self._arrive, draft)

    def _down(self, outcome: VerifyOutcome) -> None:
        self.events.at(self._arrival("down", self.costs.downlink, outcome_bytes(outcome)), self._receive, outcome)

    # -- the server ---------------------------------------------------------------------------------

    def _arrive(self, draft: DraftRequest) -> None:
        self.waiting.append(draft)
        if not self.verifying:
            self._serve()

    def _serve(self) -> None:
        """Verify the next draft (a missed speculation is dropped); outcomes leave as they are made."""
        while self.waiting:
            draft = self.waiting.popleft()
            try:
                *early, final = self.verifier.verify(draft)
            except SpeculationMissed:
                continue
            exits = self.verifier.exit_layers if draft.early_exits else ()
            ready, seconds = self.costs.verification(draft, self.verifier.target.layer_ids, exits)
            start = self.cores.place(self.events.now, seconds)
            for outcome in early:
                self.events.at(start + ready[outcome.exit_layer], self._down, outcome)
            self.events.at(start + seconds, self._down, dataclasses.replace(final, verify_time_s=seconds))
            self.events.at(start + seconds, self._verified, draft.request_id)
            self.verifying, self.server_busy_s = True, self.server_busy_s + seconds
            return

    def _verified(self, request_id: str) -> None:
        self.verifying = False
        follow = self.verifier.follow_up(request_id)  # cloud decoding: the next round, behind the waiting
        if follow is not None:
            self.waiting.append(follow)
        self._serve()


def simulate_edge_cloud(verifier: EarlyExitVerifier, drafter: EarlyExitDrafter, prompt_ids: Sequence[int],
                        config: GenerationConfig, costs: EdgeCloudCosts, *, early_exits: bool = True,
                        send_ahead: bool = False, request_id: str = "sim-0",
                        max_events: int = 1_000_000, own_drafters: Sequence[Drafter] = (),
                        **start) -> EdgeCloudTimeline:
    """One request through ``drafter`` and ``verifier`` with simulated time (module docstring).
    ``config``, ``early_exits``, ``send_ahead``: as :func:`stream_edge_cloud` (EDGE_MODES maps a mode
    name onto them); ``own_drafters`` and ``start`` as :meth:`EarlyExitDrafter.start`'s (a request's
    own drafter gets its own pre-draft worker, simulated). The drafter's cache and sender are
    swapped for simulated ones while it runs; the request is ended on both sides afterwards."""
    run = _Run(verifier, drafter, costs, max_events, list(own_drafters))
    timeline = EdgeCloudTimeline()
    cache, sender = drafter.cache, drafter.sender
    drafter.cache, drafter.sender = run.cache, run.send
    try:
        for step, _final in robot_rounds(drafter, request_id, prompt_ids, config, send=run.send,
                                         await_final=run.await_final, early_exits=early_exits,
                                         send_ahead=send_ahead, **start):  # own_drafters: in run.cache
            timeline.tokens += step.tokens
            timeline.times += [run.cache.now] * len(step.tokens)
    finally:
        timeline.stats = drafter.end(request_id) or EdgeCloudStats()
        verifier.end(request_id)
        drafter.cache, drafter.sender = cache, sender
    timeline.rounds = timeline.stats.rounds
    timeline.busy_s, timeline.d0_busy_s = [run.server_busy_s], run.cache.busy_s
    return timeline
