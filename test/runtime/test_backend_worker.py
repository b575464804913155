"""nodes/backends.Worker, what the generator backends (edge_cloud, pipeline, remote) run each request
on: chunks in order then one End, a cancel seen between chunks (the generator closed, so what the
request held is released), a peer's failure as the End's status, and at most `gate` at once."""

from __future__ import annotations

import threading

from edge_llm_ros.errors import PeerTimeout, Status
from edge_llm_ros.nodes.backends import Chunk, End, Request, RequestStats, Worker


class Events:
    def __init__(self) -> None:
        self.items: list = []
        self.ended = threading.Event()

    def __call__(self, event) -> None:
        self.items.append(event)
        if isinstance(event, End):
            self.ended.set()

    @property
    def end(self) -> End:
        assert self.ended.wait(10), self.items
        return self.items[-1]


def request(rid: str = "r") -> Request:
    return Request(rid, "hello", "ar", {})


def test_chunks_then_one_end_with_every_token_and_the_reason():
    def steps():
        yield Chunk([1, 2], "a")
        yield Chunk([3], "b")
        return "length"

    events, stats = Events(), RequestStats(mode="ar")
    Worker(request(), steps(), events, stats)
    end = events.end
    assert [type(e) for e in events.items] == [Chunk, Chunk, End]
    assert (end.finish_reason, end.status, end.token_ids) == ("length", Status.OK, [1, 2, 3])
    assert end.stats.tokens == 3 and end.stats.ttft_s >= 0 and end.stats.wall_s >= end.stats.ttft_s


def test_a_cancel_ends_the_request_between_chunks_and_closes_its_generator():
    released, step, go_on = threading.Event(), threading.Event(), threading.Event()

    def steps():
        try:
            yield Chunk([1], "a")
            step.set()
            go_on.wait(10)
            yield Chunk([2], "b")
            yield Chunk([3], "c")
        finally:
            released.set()

    events = Events()
    worker = Worker(request(), steps(), events, RequestStats())
    assert step.wait(10)
    worker.cancel()
    go_on.set()
    end = events.end
    assert (end.finish_reason, end.status) == ("cancelled", Status.CANCELLED)
    assert end.token_ids in ([1], [1, 2]) and released.is_set() and worker.wait(10)


def test_a_peers_failure_ends_the_request_with_its_code_and_the_tokens_so_far():
    def steps():
        yield Chunk([7], "x")
        raise PeerTimeout("no final VerifyResult within timeout_s=1 s")

    events = Events()
    Worker(request(), steps(), events, RequestStats())
    end = events.end
    assert (end.finish_reason, end.status, end.token_ids) == ("error", Status.TIMEOUT, [7])
    assert "timeout_s=1 s" in end.error


def test_the_gate_bounds_how_many_run_at_once():
    gate, running, most, lock = threading.Semaphore(2), [0], [0], threading.Lock()
    entered, release = threading.Semaphore(0), threading.Event()

    def steps():
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        entered.release()
        release.wait(10)
        with lock:
            running[0] -= 1
        yield Chunk([1], "a")
        return "eos"

    sinks = [Events() for _ in range(5)]
    for i, sink in enumerate(sinks):
        Worker(request(f"r{i}"), steps(), sink, RequestStats(), gate)
    assert entered.acquire(timeout=10) and entered.acquire(timeout=10)  # two run, held at release
    release.set()
    assert all(s.end.status == Status.OK for s in sinks)
    assert most[0] == 2  # two at once, never a third
