"""The robot's pre-draft cache (EE Algorithm 1's Q_p and C): drafts made on worker threads from the
contexts early outcomes hypothesise, served when the final outcome confirms one. Knows nothing about ROS."""

from __future__ import annotations

import heapq
import itertools
import queue
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field

from ..engine.decoding import draft_step
from ..engine.drafters import Drafter, TreeSpec
from ..engine.sampling import Sampler, make_generator
from ..engine.tree import TokenTree

CacheKey = tuple[str, int, tuple[int, ...]]  # (request id, round r, hypothesised context after r)


@dataclass
class PreDraft:
    """A pre-drafted tree served from the cache, with where it came from and what it cost."""

    tree: TokenTree
    exit_layer: int
    confidence: float
    draft_s: float  # its drafting time
    wait_s: float  # how long the final outcome waited for it (0 if it was ready)
    ready: bool  # finished before the final outcome asked for it
    inline: bool  # still queued when asked, so drafted then (on the critical path)


@dataclass(eq=False)
class _Job:
    key: CacheKey
    context: list[int]
    spec: TreeSpec
    warp: tuple[float, int, float]  # temperature, top_k, top_p of the request's sampler
    confidence: float
    exit_layer: int
    future: Future = field(default_factory=Future)
    state: str = "queued"  # queued -> running -> done, or cancelled
    draft_s: float = 0.0
    on_ready: Callable[[CacheKey], None] | None = None


def discard_jobs(jobs: dict, request_id: str, round: int | None) -> tuple[int, int]:
    """Pop the request's jobs (of ``round`` only, if given) from ``jobs`` (key -> a job with a
    ``state``), cancelling the queued ones: (cancelled, already started or done)."""
    cancelled = started = 0
    for key in [k for k in jobs if k[0] == request_id and (round is None or k[1] == round)]:
        job = jobs.pop(key)
        if job.state == "queued":
            job.state = "cancelled"
            cancelled += 1
        else:
            started += 1
    return cancelled, started


class PreDraftCache:
    """Pre-drafts keyed by (request id, round, hypothesised context), drafted on worker threads,
    highest confidence first (EE Algorithm 1's Q_p and C).

    ``workers`` threads (default: one per drafter); a drafter is used by one thread at a time
    (its KV cache is its own), and the critical-path drafts of :meth:`draft_now` borrow an idle
    one too. With more drafters than workers a miss never waits behind a pre-draft it cannot
    use (a running draft cannot be stopped).
    """

    def __init__(self, drafters: Sequence[Drafter], seed: int | None = None, workers: int | None = None) -> None:
        if not drafters:
            raise ValueError("PreDraftCache needs at least one drafter")
        workers = len(drafters) if workers is None else workers
        if not 1 <= workers <= len(drafters):
            raise ValueError(f"workers must be in 1..{len(drafters)} (the drafters), got {workers}")
        self.seed, self.workers = seed, workers  # what a simulated cache over the same drafters needs
        self._idle: queue.Queue = queue.Queue()
        for i, d in enumerate(drafters):
            self._idle.put((d, make_generator(None if seed is None else seed + i)))
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, _Job]] = []
        self._jobs: dict[CacheKey, _Job] = {}
        self._seq = itertools.count()
        self._closed = False
        self._running = 0
        self._workers = [threading.Thread(target=self._work, name=f"edge-llm-predraft-{i}", daemon=True)
                         for i in range(workers)]
        for w in self._workers:
            w.start()

    def __contains__(self, key: CacheKey) -> bool:
        with self._cond:
            return key in self._jobs

    def keys(self) -> list[CacheKey]:
        with self._cond:
            return list(self._jobs)

    def wait_idle(self, timeout: float) -> bool:
        """Wait until no pre-draft is queued or being drafted (its on_ready done too); False on timeout."""
        with self._cond:
            return self._cond.wait_for(
                lambda: self._running == 0 and all(job.state != "queued" for _, _, job in self._heap), timeout)

    def schedule(self, key: CacheKey, spec: TreeSpec, sampler: Sampler, confidence: float, exit_layer: int,
                 on_ready: Callable[[CacheKey], None] | None = None) -> bool:
        """Queue a pre-draft from context ``key[2]``; False if that key is already cached.
        ``on_ready(key)`` is called on the worker thread once it is drafted (its drafter is idle
        again by then), not if it was cancelled or failed."""
        with self._cond:
            if self._closed or key in self._jobs:
                return False
            job = _Job(key, list(key[2]), spec, (sampler.temperature, sampler.top_k, sampler.top_p), confidence,
                       exit_layer, on_ready=on_ready)
            self._jobs[key] = job
            heapq.heappush(self._heap, (-confidence, next(self._seq), job))
            self._cond.notify()
            return True

    def take(self, key: CacheKey) -> PreDraft | None:
        """The pre-draft for ``key`` (removed from the cache), waiting for it if it is being drafted
        and drafting it now if it was still queued; None on a miss."""
        with self._cond:
            job = self._jobs.pop(key, None)
            if job is None:
                return None
            queued = job.state == "queued"
            if queued:
                job.state = "cancelled"
        start = time.perf_counter()
        if queued:
            tree, seconds = self.draft_now(job.context, job.spec, Sampler(*job.warp))
            return PreDraft(tree, job.exit_layer, job.confidence, seconds, seconds, False, True)
        ready = job.future.done()
        tree = job.future.result()
        return PreDraft(tree, job.exit_layer, job.confidence, job.draft_s, time.perf_counter() - start, ready, False)

    def discard(self, request_id: str, round: int | None = None) -> tuple[int, int]:
        """Forget the request's entries (of ``round`` only, if given): returns (cancelled before
        starting, already started or done — drafting spent for nothing)."""
        with self._cond:
            return discard_jobs(self._jobs, request_id, round)

    def draft_now(self, context: list[int], spec: TreeSpec, sampler: Sampler) -> tuple[TokenTree, float]:
        """Draft on the caller's thread with an idle drafter (waiting for one); (tree, seconds incl. waiting)."""
        start = time.perf_counter()
        drafter, generator = self._idle.get()
        try:
            warped = Sampler(sampler.temperature, sampler.top_k, sampler.top_p, generator)
            tree = draft_step(drafter, context, spec, warped)
        finally:
            self._idle.put((drafter, generator))
        return tree, time.perf_counter() - start

    def _work(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._heap or self._closed)
                if self._closed:
                    return
                job = heapq.heappop(self._heap)[-1]
                if job.state != "queued":
                    continue
                job.state = "running"
                self._running += 1
            drafter, generator = self._idle.get()
            start = time.perf_counter()
            try:
                tree = draft_step(drafter, job.context, job.spec, Sampler(*job.warp, generator))
                job.draft_s = time.perf_counter() - start
                job.future.set_result(tree)
            except Exception as exc:  # surfaces in take(); the worker goes on
                job.future.set_exception(exc)
            finally:
                job.state = "done"
                self._idle.put((drafter, generator))
            try:
                if job.on_ready is not None and job.future.exception() is None:
                    job.on_ready(job.key)
            finally:
                with self._cond:
                    self._running -= 1
                    self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            for job in self._jobs.values():
                if job.state == "queued":
                    job.state = "cancelled"
            self._jobs.clear()
            self._cond.notify_all()
        for w in self._workers:
            w.join(timeout=30)


