"""Serving many requests at once: continuous batching on llama.cpp, interleaving elsewhere.

Contract: a node calls ``submit(prompt_ids, config)`` on a :class:`Server` and gets a
:class:`Stream` at once, or :class:`BusyError` when the server is full; it reads the stream's
tokens as they come and may ``cancel()`` it. Every request keeps its own sampling settings,
seed, stop strings and token limit. Knows nothing about ROS.

:class:`BatchServer` (``ar`` on llama.cpp): one llama.cpp sequence per request, each with a KV
stream of its own (:class:`LlamaBatch`), and one ``llama_decode`` per step carrying every running
request's next row. A new request joins at the next step, its prompt decoded in chunks beside the
others' rows: at most ``prefill_rows`` prompt rows per step, first come first served. On a CPU a
prompt row costs the same in a chunk of 64 as in one of 496 (3.8 ms here), so small chunks lose
no throughput, while the first arrivals of a burst get their first tokens sooner (16 closed-loop
clients in one process: time to first token p50 0.7 s instead of 1.8 s with 496-row chunks) and
running requests never stall for a whole burst's prefill. A finished or cancelled request leaves and its cells are freed.
Exactness, measured with llama-cpp-python 0.3.36 on SmolLM2's Q4_1 GGUF:
in llama.cpp's unified KV cache a row's logits moved by up to 0.59 whenever another sequence held
different tokens at the same positions (even when decoded in another call); with a stream per
sequence every request gets its solo greedy output token for token (test/core/test_batching.py:
16 concurrent requests, equal prompt lengths among them, against solo decoding). Requests share
no prompt prefix (no ``seq_cp``: with a stream each it would copy the whole stream).

:class:`EngineServer` (any mode, any backend): each request is the engine's own ``generate``
stream, advanced one token per turn, round robin. On torch targets up to ``max_requests`` run
interleaved (each with its own cache; not batched into one forward). A llama.cpp target has one
live cache, so there it serves one request at a time and queues the rest (the speculative modes
on llama.cpp; for many requests at once ``ar`` batched is the faster exact choice).

Admission is bounded: ``max_requests`` run, ``max_pending`` wait in order; a request beyond
that is refused with BusyError at once (never queued without bound, never hangs).
"""

from __future__ import annotations

import itertools
import os
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from edge_llm_ros.errors import Busy

from .config import GenerationConfig, GenerationStats
from .decoding import StopStrings, check_prompt, check_request, eos_ids, finish_reason, generate
from .drafters import Drafter
from .llama_backend import LlamaCppError, LlamaHandles, free_handles, load_model, new_context
from .models import CausalLM, _model_path, load_tokenizer
from .sampling import Sampler, make_generator


class BusyError(Busy):
    """The server is full: ``max_requests`` running and ``max_pending`` waiting."""


class ServerClosedError(RuntimeError):
    """The server was closed (or its step loop failed) before the request ended."""


_END = object()


class Stream:
    """One request as its caller sees it: token ids as they are generated, then how it ended.

    Iterate it for lists of new token ids (``ar``: one per step); ``stats`` is filled in live
    (``finish_reason`` set at the end: eos | length | stop | cancelled | error, ``error`` saying why).
    Or give ``listener(stream, tokens)``: called on the server's step thread with each list of new
    tokens and once with None at the end, between two decodes (so a node's per-token work never
    competes with the decode for the cores). A listener that raises ends its request (error).
    """

    def __init__(self, request_id: str, prompt: list[int], config: GenerationConfig,
                 listener: Callable[[Stream, list[int] | None], None] | None = None) -> None:
        self.request_id = request_id
        self.prompt = prompt
        self.config = config
        self.tokens: list[int] = []
        self.stats = GenerationStats(mode=config.mode, prompt_tokens=len(prompt))
        self.error = ""
        self.submitted = time.perf_counter()
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._listener = listener
        self._cancelled = threading.Event()
        self._done = threading.Event()

    # -- the caller's side ------------------------------------------------------------------------

    def cancel(self) -> None:
        """Ask the server to end this request at its next step (finish_reason ``cancelled``)."""
        self._cancelled.set()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def next_tokens(self, timeout: float | None = None) -> list[int] | None:
        """The next new tokens (blocking up to ``timeout``; queue.Empty after it); None at the end."""
        item = self._queue.get(timeout=timeout)
        return None if item is _END else item

    def __iter__(self) -> Iterator[list[int]]:
        while (tokens := self.next_tokens()) is not None:
            yield tokens

    def wait(self, timeout: float | None = None) -> bool:
        return self._done.wait(timeout)

    # -- the server's side ------------------------------------------------------------------------

    def _emit(self, tokens: list[int]) -> None:
        now = time.perf_counter()
        self.tokens += tokens
        self.stats.new_tokens = len(self.tokens)
        self.stats.ttft_s = self.stats.ttft_s or now - self.submitted
        self.stats.total_time_s = now - self.submitted
        self._queue.put(list(tokens))
        self._tell(list(tokens))

    def _tell(self, tokens: list[int] | None) -> None:
        if self._listener is None:
            return
        try:
            self._listener(self, tokens)
        except Exception as exc:  # the request ends; the server goes on
            self._listener = None
            self.error = f"listener failed: {exc!r}"
            self.cancel()

    def _finish(self, reason: str, error: str = "") -> None:
        if self._done.is_set():
            return
        if self.error.startswith("listener failed"):
            reason, error = "error", self.error
        self.stats.finish_reason, self.error = reason, error
        self.stats.total_time_s = time.perf_counter() - self.submitted
        self._done.set()
        self._queue.put(_END)
        self._tell(None)


class Server:
    """Admission, the step thread and the streams; subclasses say what one step does.

    ``max_requests`` requests run at once and ``max_pending`` wait; ``submit`` beyond that raises
    BusyError. ``run_limit``: how many of the ``max_requests`` may actually run at once (the
    rest of them wait too).
    """

    kind = "server"

    def __init__(self, *, max_requests: int, max_pending: int, name: str = "serve") -> None:
        if max_requests < 1:
            raise ValueError(f"max_requests must be >= 1, got {max_requests}")
        if max_pending < 0:
            raise ValueError(f"max_pending must be >= 0, got {max_pending}")
        self.max_requests, self.max_pending = max_requests, max_pending
        self.run_limit = max_requests
        self._pending: deque[Stream] = deque()
        self._running: list = []  # subclass state per running request
        self._lock = threading.Condition()
        self._closed = False
        self._retiring = False
        self._ids = itertools.count()
        self._thread = threading.Thread(target=self._loop, daemon=True, name=f"{name}-steps")
        self._started = False

    # -- requests ---------------------------------------------------------------------------------

    def check(self, prompt_ids: Sequence[int], config: GenerationConfig) -> list[int]:
        """The prompt as ids, or ValueError saying what is wrong with the request (a subclass's)."""
        raise NotImplementedError

    def submit(self, prompt_ids: Sequence[int], config: GenerationConfig, request_id: str | None = None,
               listener: Callable[[Stream, list[int] | None], None] | None = None) -> Stream:
        """Queue a request; its Stream at once (``listener``: see :class:`Stream`). ValueError for a
        bad request, BusyError when full, ServerClosedError after close()."""
        prompt = self.check(prompt_ids, config)
        stream = Stream(request_id or f"r{next(self._ids)}", prompt, config, listener)
        with self._lock:
            if self._closed or self._retiring:
                raise ServerClosedError("the server is shut down")
            running = len(self._running)
            if running + len(self._pending) >= self.max_requests + self.max_pending:
                raise BusyError(f"busy: {running} requests running and {len(self._pending)} waiting "
                                f"(max_requests={self.max_requests}, max_pending={self.max_pending})")
            self._pending.append(stream)
            if not self._started:
                self._started = True
                self._thread.start()
            self._lock.notify_all()
        return stream

    def load(self) -> tuple[int, int]:
        """(running, waiting) requests now."""
        with self._lock:
            return len(self._running), len(self._pending)

    def close(self, timeout: float = 10.0) -> None:
        """End every request (finish_reason error, "server shut down") and stop the step thread."""
        with self._lock:
            self._closed = True
            self._lock.notify_all()
        if self._started and self._thread is not threading.current_thread():
            self._thread.join(timeout)
        with self._lock:
            for stream in list(self._pending):
                stream._finish("error", "server shut down")
            self._pending.clear()
        self._release_all("server shut down")
        if not self._thread.is_alive():  # never free the model under a running step
            self._free()

    def _free(self) -> None:
        """Free the models (a subclass's)."""

    def close_when_idle(self) -> None:
        """Take no new request; close once the running and waiting ones have ended (a replaced server)."""
        with self._lock:
            self._retiring = True
            started = self._started
            self._lock.notify_all()
        if not started:  # no step thread to do it
            self.close()

    # -- the step thread --------------------------------------------------------------------------

    def _loop(self) -> None:
        while True:
            with self._lock:
                while not self._closed and not self._pending and not self._running:
                    if self._retiring:
                        self._closed = True
                        break
                    self._lock.wait()
                if self._closed:
                    break
                while self._pending and len(self._running) < self.run_limit:
                    stream = self._pending.popleft()
                    if stream.cancelled:
                        stream._finish("cancelled")
                        continue
                    self._running.append(self._start(stream))
            try:
                for state in [s for s in self._running if s.stream.cancelled]:
                    self._leave(state, "cancelled")
                if self._running:
                    self._step()
            except Exception as exc:  # a failed step ends what was running; the server goes on
                self._release_all(f"{type(exc).__name__}: {exc}")
        if self._retiring:  # idle at last: nothing runs any more, so this thread frees the models
            self._free()

    def _leave(self, state, reason: str, error: str = "") -> None:
        """End a running request (a subclass's state for it)."""
        with self._lock:
            if state in self._running:
                self._running.remove(state)
        self._end(state, reason, error)

    def _release_all(self, error: str) -> None:
        with self._lock:
            running, self._running = self._running, []
        for state in running:
            self._end(state, "error", error)

    def _start(self, stream: Stream):
        raise NotImplementedError

    def _step(self) -> None:
        """One step of every running request (there is at least one; cancelled ones have left)."""
        raise NotImplementedError

    def _end(self, state, reason: str, error: str = "") -> None:
        raise NotImplementedError


# -- llama.cpp: one sequence per request -----------------------------------------------------------


class LlamaBatch(LlamaHandles):
    """One llama.cpp context holding up to ``sequences`` sequences of up to ``context`` tokens each,
    a KV stream each; ``decode`` evaluates rows of several sequences in one ``llama_decode``."""

    def __init__(self, source: str | os.PathLike | None = None, *, sequences: int = 16, context: int = 2048,
                 n_threads: int | None = None, n_batch: int = 512, tokenizer="auto") -> None:
        import llama_cpp as lc

        self._lc = lc
        self.path = _model_path(source)
        if self.path.suffix != ".gguf":
            raise ValueError(f"the llama.cpp backend loads .gguf files, got {self.path}")
        if sequences < 1 or context < 2 or n_batch < 1:
            raise ValueError(f"need sequences >= 1, context >= 2 and n_batch >= 1, got {sequences}, {context}, {n_batch}")
        self._model = load_model(lc, self.path)
        self.n_threads = n_threads or torch.get_num_threads()
        self._ctx = new_context(lc, self._model, sequences * context, self.n_threads, sequences=sequences,
                                n_batch=n_batch)
        if not self._ctx:
            raise LlamaCppError(f"llama.cpp could not create a context of {sequences} x {context} tokens for {self.path}")
        self._mem = lc.llama_get_memory(self._ctx)
        self.sequences, self.max_context, self.n_batch = sequences, context, n_batch
        self.vocab_size = lc.llama_vocab_n_tokens(lc.llama_model_get_vocab(self._model))
        self._batch = lc.llama_batch_init(n_batch, 0, 1)
        self.tokenizer = load_tokenizer(self.path) if tokenizer == "auto" else tokenizer

    def __repr__(self) -> str:
        return (f"LlamaBatch({self.path.name}, {self.sequences} sequences x {self.max_context} tokens, "
                f"{self.n_threads} threads)")

    def decode(self, work: Sequence[tuple[int, Sequence[int], int]]) -> list[np.ndarray]:
        """One ``llama_decode`` of ``work``: (sequence, tokens, position of the first) each, at most
        ``n_batch`` rows in all; the logits [V] after each entry's last token, as views into
        llama.cpp's buffer (valid until the next decode: copy what you keep)."""
        batch, lc = self._batch, self._lc
        row, last = 0, []
        for seq, tokens, first in work:
            for offset, token in enumerate(tokens):
                if row >= self.n_batch:
                    raise ValueError(f"a step of more than n_batch={self.n_batch} rows")
                batch.token[row] = token
                batch.pos[row] = first + offset
                batch.n_seq_id[row] = 1
                batch.seq_id[row][0] = seq
                batch.logits[row] = offset == len(tokens) - 1
                row += 1
            last.append(row - 1)
        batch.n_tokens = row
        code = lc.llama_decode(self._ctx, batch)
        if code != 0:
            raise LlamaCppError(f"llama_decode failed with {code} ({row} rows of {len(work)} sequences)")
        return [np.ctypeslib.as_array(lc.llama_get_logits_ith(self._ctx, i), shape=(self.vocab_size,)) for i in last]

    def drop(self, seq: int) -> None:
        """Forget every cell of sequence ``seq``."""
        self._lc.llama_memory_seq_rm(self._mem, seq, -1, -1)

    def close(self) -> None:
        free_handles(self)

    def __del__(self) -> None:  # pragma: no cover - interpreter shutdown order varies
        try:
            self.close()
        except Exception:
            pass


@dataclass
class _Sequence:
    """A running request in the batch: its llama.cpp sequence and how far it got."""

    stream: Stream
    seq: int
    sampler: Sampler | None  # None: greedy (argmax on the logits view)
    eos: tuple[int, ...]
    stops: StopStrings
    limit: int
    fed: int = 0  # prompt tokens decoded so far
    generated: list[int] = field(default_factory=list)


PREFILL_ROWS = 64  # prompt rows per step (see the module docstring)


class BatchServer(Server):
    """``ar`` for many requests at once on llama.cpp: continuous batching (see the module docstring)."""

    kind = "batched"

    def __init__(self, batch: LlamaBatch, *, max_requests: int | None = None, max_pending: int = 16,
                 prefill_rows: int = PREFILL_ROWS) -> None:
        super().__init__(max_requests=max_requests or batch.sequences, max_pending=max_pending, name="batch")
        if self.max_requests > batch.sequences:
            raise ValueError(f"max_requests={self.max_requests} exceeds the batch's {batch.sequences} sequences")
        self.batch = batch
        self.tokenizer = batch.tokenizer
        if prefill_rows < 1 or prefill_rows + self.max_requests > batch.n_batch:
            raise ValueError(f"prefill_rows={prefill_rows} must be >= 1 and fit beside {self.max_requests} requests "
                             f"in n_batch={batch.n_batch} rows")
        self.prefill_rows = prefill_rows
        self._free_seqs = list(range(batch.sequences))[::-1]
        self.steps = 0

    def check(self, prompt_ids: Sequence[int], config: GenerationConfig) -> list[int]:
        if config.mode != "ar":
            raise ValueError(f"the batched llama.cpp server runs mode ar, got {config.mode!r}")
        return check_prompt(self.batch, prompt_ids, config, self.batch.max_context)

    def _start(self, stream: Stream) -> _Sequence:
        config = stream.config
        sampler = None if config.greedy else Sampler(config.temperature, config.top_k, config.top_p,
                                                     make_generator(config.seed))
        limit = min(config.max_new_tokens, self.batch.max_context - len(stream.prompt))
        return _Sequence(stream, self._free_seqs.pop(), sampler, eos_ids(self.batch, config),
                         StopStrings(self.tokenizer, config.stop_strings), limit)

    def _step(self) -> None:
        work, fed, budget = [], [], self.prefill_rows
        for state in self._running:
            prompt = state.stream.prompt
            if state.fed < len(prompt):  # prefill, in chunks that fit the step's budget
                take = min(len(prompt) - state.fed, budget)
                if take == 0:
                    continue
                budget -= take
                work.append((state.seq, prompt[state.fed: state.fed + take], state.fed))
                fed.append((state, take))
            else:
                work.append((state.seq, state.generated[-1:], len(prompt) + len(state.generated) - 1))
                fed.append((state, 0))
        logits = self.batch.decode(work)
        self.steps += 1
        for (state, take), row in zip(fed, logits):
            state.fed += take
            if state.fed < len(state.stream.prompt):
                continue  # more prompt to go
            token = int(row.argmax()) if state.sampler is None else state.sampler.draw(
                state.sampler.probs(torch.from_numpy(row.copy())))
            state.generated.append(token)
            state.stream._emit([token])
            reason = finish_reason(state.generated, state.limit, state.eos, state.stops)
            if reason:
                self._leave(state, reason)

    def _free(self) -> None:
        self.batch.close()

    def _end(self, state: _Sequence, reason: str, error: str = "") -> None:
        self.batch.drop(state.seq)
        self._free_seqs.append(state.seq)
        state.stream._finish(reason, error)


# -- any mode: the engine's streams, interleaved ------------------------------------------------


@dataclass
class _Turn:
    """A running request on the engine: its generator of tokens."""

    stream: Stream
    tokens: Generator[int, None, None]


class EngineServer(Server):
    """The engine's ``generate`` per request, one token per turn, round robin (see the module docstring)."""

    def __init__(self, target: CausalLM, drafter: Drafter | None = None, *, max_requests: int = 8,
                 max_pending: int = 16) -> None:
        super().__init__(max_requests=max_requests, max_pending=max_pending, name="engine")
        self.target, self.drafter, self.tokenizer = target, drafter, target.tokenizer
        # each request holds a cache of its own: as many run at once as the target's live caches
        self.run_limit = min(max_requests, target.live_caches or max_requests)
        self.kind = "one at a time" if self.run_limit == 1 else "interleaved"

    def check(self, prompt_ids: Sequence[int], config: GenerationConfig) -> list[int]:
        return check_request(self.target, prompt_ids, config, self.drafter if config.mode != "ar" else None)

    def _start(self, stream: Stream) -> _Turn:
        stats = stream.stats
        tokens = generate(self.target, stream.prompt, stream.config,
                          self.drafter if stream.config.mode != "ar" else None, stats)
        return _Turn(stream, tokens)

    def _step(self) -> None:
        for turn in list(self._running):
            try:
                with torch.inference_mode():
                    token = next(turn.tokens)
            except StopIteration:
                self._leave(turn, turn.stream.stats.finish_reason or "eos")
                continue
            turn.stream._emit([token])
            if turn.stream.stats.finish_reason:
                self._leave(turn, turn.stream.stats.finish_reason)

    def _free(self) -> None:
        self.target.close()

    def _end(self, turn: _Turn, reason: str, error: str = "") -> None:
        turn.tokens.close()
        turn.stream._finish(reason, error)
