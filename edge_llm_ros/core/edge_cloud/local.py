"""Both halves in one process: with a pluggable downlink and the server inline (tests, the bench's
references), or with the server on its own thread behind emulated links both ways (the nav bench's
edge-cloud decisions: two nodes' timing, in one process). Knows nothing about ROS."""

from __future__ import annotations

import collections
import queue
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from ..engine.config import GenerationConfig
from .records import DraftRequest, SpeculationMissed, VerifyOutcome
from .robot import EarlyExitDrafter, EdgeCloudStats, FinalStep, robot_rounds
from .server import EarlyExitVerifier

Deliver = Callable[[VerifyOutcome], None]
Link = Callable[[VerifyOutcome, Deliver], None]  # link(outcome, deliver): deliver now or later, any thread


class Shaper(Protocol):
    """One direction of an emulated link (runtime.link.Link has this shape): ``deliver(payload)``
    runs on the link's thread once the message of ``size_bytes`` has crossed, in send order."""

    def send(self, payload: Any, size_bytes: int | None, deliver: Callable[[Any], None]) -> Any: ...


def direct_link(outcome: VerifyOutcome, deliver: Deliver) -> None:
    """The ideal link: every outcome arrives the moment it is sent."""
    deliver(outcome)


@dataclass
class EdgeCloudResult:
    tokens: list[int]
    stats: EdgeCloudStats
    wall_s: float


def stream_edge_cloud(
    verifier: EarlyExitVerifier,
    drafter: EarlyExitDrafter,
    prompt_ids: Sequence[int],
    config: GenerationConfig,
    **kwargs,
) -> Iterator[int]:
    """Stream one request through both halves: the robot drafts, the server verifies and streams
    outcomes through ``link`` (early and final) to the robot's receiver, which pre-drafts from
    early ones; each final outcome yields its tokens and releases the next draft. Keywords: those
    of :func:`edge_cloud_rounds`."""
    for step, _final in edge_cloud_rounds(verifier, drafter, prompt_ids, config, **kwargs):
        yield from step.tokens


def edge_cloud_rounds(
    verifier: EarlyExitVerifier,
    drafter: EarlyExitDrafter,
    prompt_ids: Sequence[int],
    config: GenerationConfig,
    *,
    request_id: str = "ee-0",
    link: Link = direct_link,
    timeout_s: float = 120.0,
    stats_out: list | None = None,
    early_exits: bool = True,
    send_ahead: bool = False,
    **start,
) -> Iterator[tuple[FinalStep, VerifyOutcome]]:
    """:func:`robot_rounds` of one request with the verifier in this process: (step, its final
    outcome) per round. ``stats_out`` (a list) receives the request's EdgeCloudStats when it ends.
    ``early_exits`` / ``send_ahead`` / ``start``: as :meth:`EarlyExitDrafter.start` (``config.mode``
    ``ar``: cloud decoding); drafts sent ahead go up the same in-order uplink."""
    inbox: queue.Queue = queue.Queue()
    to_server: collections.deque[DraftRequest] = collections.deque()  # the uplink, in order

    def receive(outcome: VerifyOutcome) -> None:  # the robot's Receiver (Algorithm 1)
        if outcome.final:
            inbox.put(outcome)
        else:
            drafter.on_early(outcome)

    def await_final() -> VerifyOutcome:
        while to_server:  # the server: verify what came up, in order
            draft = to_server.popleft()
            try:
                for outcome in verifier.verify(draft):
                    link(outcome, receive)
            except SpeculationMissed:
                continue
            follow = verifier.follow_up(draft.request_id)
            if follow is not None:
                to_server.append(follow)
        try:
            return inbox.get(timeout=timeout_s)
        except queue.Empty:
            raise TimeoutError(f"no final outcome for {request_id!r} within {timeout_s} s") from None

    sender, drafter.sender = drafter.sender, to_server.append  # this loop is the uplink while it runs
    try:
        yield from robot_rounds(drafter, request_id, prompt_ids, config, send=to_server.append,
                                await_final=await_final, early_exits=early_exits, send_ahead=send_ahead, **start)
    finally:
        stats = drafter.end(request_id)
        drafter.sender = sender
        verifier.end(request_id)
        if stats_out is not None and stats is not None:
            stats_out.append(stats)


def linked_rounds(
    verifier: EarlyExitVerifier,
    drafter: EarlyExitDrafter,
    prompt_ids: Sequence[int],
    config: GenerationConfig,
    *,
    uplink: Shaper,
    downlink: Shaper,
    request_id: str = "ee-0",
    timeout_s: float = 120.0,
    stats_out: list | None = None,
    early_exits: bool = True,
    send_ahead: bool = False,
    **start,
) -> Iterator[tuple[FinalStep, VerifyOutcome]]:
    """:func:`edge_cloud_rounds` with the server on a thread of its own, as verifier_node runs it:
    every draft (pre-drafts sent ahead included) crosses ``uplink`` at its wire size, the server
    verifies what has arrived in order while the robot goes on drafting, and every outcome crosses
    ``downlink`` (early ones are pre-drafted from on arrival). A verification that fails ends the
    request with its error; none within ``timeout_s`` raises TimeoutError."""
    from .records import draft_bytes, outcome_bytes

    inbox: queue.Queue = queue.Queue()  # finals and failures, for the robot
    arrived: queue.Queue = queue.Queue()  # drafts off the uplink, for the server; None ends it

    def receive(outcome: VerifyOutcome) -> None:
        if outcome.final:
            inbox.put(outcome)
        else:
            drafter.on_early(outcome)

    def serve() -> None:
        while (draft := arrived.get()) is not None:
            try:
                for outcome in verifier.verify(draft):
                    downlink.send(outcome, outcome_bytes(outcome), receive)
            except SpeculationMissed:
                continue
            except Exception as exc:  # refused or failed: the robot raises it
                inbox.put(exc)
                continue
            follow = verifier.follow_up(draft.request_id)
            if follow is not None:  # the server's own next round: no link to cross
                arrived.put(follow)

    def send(draft: DraftRequest) -> None:
        uplink.send(draft, draft_bytes(draft), arrived.put)

    def await_final() -> VerifyOutcome:
        try:
            got = inbox.get(timeout=timeout_s)
        except queue.Empty:
            raise TimeoutError(f"no final outcome for {request_id!r} within {timeout_s} s") from None
        if isinstance(got, BaseException):
            raise got
        return got

    server = threading.Thread(target=serve, name=f"server {request_id}", daemon=True)
    server.start()
    sender, drafter.sender = drafter.sender, send
    try:
        yield from robot_rounds(drafter, request_id, prompt_ids, config, send=send, await_final=await_final,
                                early_exits=early_exits, send_ahead=send_ahead, **start)
    finally:
        arrived.put(None)  # drafts still on the uplink arrive to nobody
        server.join(timeout_s)
        stats = drafter.end(request_id)
        drafter.sender = sender
        verifier.end(request_id)
        if stats_out is not None and stats is not None:
            stats_out.append(stats)


def run_edge_cloud(
    verifier: EarlyExitVerifier,
    drafter: EarlyExitDrafter,
    prompt_ids: Sequence[int],
    config: GenerationConfig,
    **kwargs,
) -> EdgeCloudResult:
    """Blocking wrapper of :func:`stream_edge_cloud`: every token, the robot's stats, wall time."""
    start, out = time.perf_counter(), []
    tokens = list(stream_edge_cloud(verifier, drafter, prompt_ids, config, stats_out=out, **kwargs))
    return EdgeCloudResult(tokens, out[0], time.perf_counter() - start)


