"""What serves a Generate request behind the front door (nodes/front_door.py): the Backend protocol.

A backend turns a :class:`Request` into a stream of :class:`Chunk` s and one :class:`End`, handed to
the request's listener, and can cancel it:

    handle = backend.start(request, listener)     # Invalid / Busy / Inactive at once, or a Handle
    listener(Chunk(token_ids, text, probs))       # zero or more, from some thread of the backend's
    listener(End(finish_reason, status, error, stats))   # exactly once, last
    handle.cancel(); handle.wait(timeout)

The front door owns everything a client sees (admission, the `generate` action, `instruction` ->
`response`, stats, lifecycle); a backend owns how tokens are made:

    local        the engine or the batch server on this device (backends/local.py)
    edge_cloud   the robot side of EE: drafts to a verifier_node over `draft` / `verify`
    pipeline     D0 of a stage pipeline (FlowSpec), outline decoding included
    remote       an OpenAI-compatible server (vLLM, SGLang, llama.cpp's server, Ollama): `ar` only

Which modes each serves is edge_llm_ros/modes.py's registry. A backend declares its own parameters
(a dataclass, `params`), which the node declares only when that backend is chosen.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol, runtime_checkable

from edge_llm_ros.errors import Cancelled, Status, status_of


@dataclass(frozen=True)
class Request:
    """One request, as the front door checked it: the prompt text, the mode ('' = the backend's own)
    and the GenerationConfig fields the client set (goal_overrides: token limit, sampling, seed,
    stop strings; empty for an instruction)."""

    request_id: str
    prompt: str
    mode: str = ""
    overrides: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Chunk:
    """Tokens a step committed, the text they add, and the target's probability of each (if known)."""

    token_ids: list[int]
    text: str
    probs: list[float] = field(default_factory=list)


@dataclass
class RequestStats:
    """One request's numbers, as InferenceStats aggregates them (front_door.stats_message)."""

    mode: str = ""
    backend: str = ""  # where the target ran: llama.cpp | torch | a server's URL
    tokens: int = 0
    wall_s: float = 0.0
    ttft_s: float = 0.0
    accepted: list[int] = field(default_factory=list)  # drafted tokens accepted per verification round
    drafted: int = 0  # drafted tokens offered for verification
    draft_time_s: float = 0.0
    verify_time_s: float = 0.0
    hits: int = 0  # edge-cloud pre-draft cache
    misses: int = 0
    hit_layers: list[int] = field(default_factory=list)
    alt: float = 0.0  # stage pipeline (FlowSpec §V-A)
    alr: float = 0.0
    drafts: int = 0
    draft_forwards: int = 0
    draft_time_is_cpu: bool = False
    ignored_results: int = 0


@dataclass(frozen=True)
class End:
    """How a request ended: eos | length | stop | cancelled | error, its status code, why (for an
    error), every token id, and its stats."""

    finish_reason: str
    status: Status = Status.OK
    error: str = ""
    token_ids: list[int] = field(default_factory=list)
    stats: RequestStats = field(default_factory=RequestStats)

    @classmethod
    def of(cls, exc: BaseException, tokens: list[int], stats: RequestStats) -> End:
        """The end of a request that raised ``exc`` (a cancel, a peer's failure, a bad field)."""
        if isinstance(exc, Cancelled):
            return cls("cancelled", Status.CANCELLED, "", tokens, stats)
        return cls("error", status_of(exc), str(exc) or repr(exc), tokens, stats)


Listener = Callable[[Any], None]  # called with each Chunk, then once with the End


class Handle(Protocol):
    def cancel(self) -> None: ...

    def wait(self, timeout: float | None = None) -> bool: ...


class Backend(Protocol):
    """See the module docstring. ``node``: the front door (endpoints, logger, clock)."""

    name: ClassVar[str]
    params: ClassVar[type]  # the backend's parameters dataclass (nodes/parameters.py)
    default_mode: str  # what a request with mode '' runs

    def load(self) -> str:
        """Load models / connect; a line saying what it serves. ValueError or OSError if it cannot."""

    def unload(self) -> None:
        """Free what load() made (also after a load that failed half-way)."""

    def start(self, request: Request, listener: Listener) -> Handle:
        """Start ``request``; Invalid, Busy or Inactive raised at once when it cannot start."""


@runtime_checkable
class Diagnosed(Protocol):
    """A backend with its own part of the front door's status on /diagnostics (nodes/diagnostics.py):
    the front door calls ``diagnose`` every period while loaded, with the RequestStats of the
    requests that ended in the last minute. edge_cloud's says whether a verifier is there."""

    def diagnose(self, status: Any, ended: list[RequestStats]) -> None:
        """Add keys to ``status`` and raise its level (Status.merge) where something is wrong."""


class Worker:
    """A request that a backend runs as a generator on a thread of its own: the generator yields
    Chunks, fills ``stats`` (the backend's figures; tokens, wall and first-token times are counted
    here) and returns the finish reason (eos | length | stop). A cancel is seen between two chunks:
    the generator is closed, so its ``finally`` releases what the request held. ``gate`` (a
    semaphore) bounds how many run at once; the others wait for it."""

    def __init__(self, request: Request, steps: Iterator[Chunk], listener: Listener, stats: RequestStats,
                 gate: threading.Semaphore | None = None) -> None:
        self.request, self.steps, self.listener, self.stats, self.gate = request, steps, listener, stats, gate
        self._cancelled, self._done = threading.Event(), threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"request-{request.request_id}")
        self._thread.start()

    def cancel(self) -> None:
        self._cancelled.set()

    def wait(self, timeout: float | None = None) -> bool:
        return self._done.wait(timeout)

    def _run(self) -> None:
        tokens: list[int] = []
        started = time.monotonic()
        try:
            if self.gate is not None:
                self.gate.acquire()
            try:
                end = self._drive(tokens, started)
            finally:
                if self.gate is not None:
                    self.gate.release()
        except Exception as exc:  # noqa: BLE001 - every request ends with an End, the node goes on
            self.stats.wall_s = time.monotonic() - started
            end = End.of(exc, tokens, self.stats)
        self.stats.tokens = len(tokens) or self.stats.tokens  # a remote server may count what it does not send
        try:
            self.listener(end)
        finally:
            self._done.set()

    def _drive(self, tokens: list[int], started: float) -> End:
        reason = ""
        try:
            while True:
                if self._cancelled.is_set():
                    raise Cancelled("cancelled")
                try:
                    chunk = next(self.steps)
                except StopIteration as stop:
                    reason = stop.value or "eos"
                    break
                if chunk.token_ids and not tokens:
                    self.stats.ttft_s = time.monotonic() - started
                tokens += chunk.token_ids
                self.listener(chunk)
        finally:
            self.steps.close()
            self.stats.wall_s = time.monotonic() - started
        return End(reason, Status.OK, "", tokens, self.stats)
