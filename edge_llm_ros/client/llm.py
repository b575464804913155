"""LLMClient: the Generate action as a few verbs, on either runtime.

    with LLMClient() as llm:                       # /edge_llm/generate; a node and a thread of its own
        llm.wait_until_ready(60)                   # the server answers and its node is lifecycle-active
        print(llm.generate("Name three colors.", max_new_tokens=32).text)
        for chunk in llm.stream("Tell me a story."):   # leaving the loop early cancels the goal
            print(chunk.text, end="", flush=True)

Contract. :meth:`LLMClient.stream` yields :class:`Chunk` records as the server's feedback comes;
iterating it to the end gives the :class:`Result` as ``request.result()``. The chunks add up to the
result: feedback still on its way when the result comes is waited for (FEEDBACK_GRACE_S), and what
never came is yielded from the result as one last chunk. :meth:`LLMClient.generate` is
``submit(...).result()``. A request that does not end with an answer raises the exception of
edge_llm_ros.errors for its status (Busy, Inactive, Invalid, PeerTimeout, PeerGone, Cancelled,
Failed), with its partial Result as ``exc.result``; a goal the server rejects is Busy. Nothing
waits for ever: no server or no result within the timeout is :class:`NoAnswer` (a TimeoutError;
the goal is cancelled), a server that leaves while a request runs is :class:`ServerGone` (a
PeerGone). Each request is a :class:`Request` handle: ``cancel()``, ``result()``, iteration.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import queue
import time
from collections.abc import Iterator, Sequence
from typing import Any, Callable

from edge_llm_ros.client import ready
from edge_llm_ros.client.records import Chunk, Result
from edge_llm_ros.client.transport import Transport, attach, own_node
from edge_llm_ros.errors import Busy, Invalid, PeerGone, RequestError, Status, error_for
from edge_llm_ros.runtime import goals
from edge_llm_ros.runtime.actions import STATUS_ABORTED, STATUS_CANCELED
from edge_llm_ros.runtime.goals import NoAnswer, ServerGoneError

GENERATE = "edge_llm_ros/action/Generate"
DEFAULT_TIMEOUT_S = 300.0  # a request's answer, from sending it
CONNECT_TIMEOUT_S = 30.0  # a server to take the goal
FEEDBACK_GRACE_S = 5.0  # feedback is a topic and the result a service reply: the last chunks may come later
UINT32, INT64 = (0, 2**32 - 1), (-(2**63), 2**63 - 1)
_DONE = object()  # put on a request's queue when its result is in
_names = itertools.count()


class ServerGone(PeerGone):
    """The Generate server left (its process died, or it left the graph) while the request ran."""


def _checked_int(name: str, value: Any, bounds: tuple[int, int]) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not bounds[0] <= value <= bounds[1]:
        raise Invalid(f"{name} must be a whole number in [{bounds[0]}, {bounds[1]}], got {value!r}")
    return value


def _checked_float(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise Invalid(f"{name} must be a number, got {value!r}")
    return float(value)


def _strings(name: str, value: str | Sequence[str]) -> list[str]:
    values = [value] if isinstance(value, str) else list(value)
    if not all(isinstance(v, str) for v in values):
        raise Invalid(f"{name} must be a string or a list of strings, got {value!r}")
    return values


def goal_fields(prompt: str, max_new_tokens: int = 0, temperature: float = 0.0, top_k: int = 0, top_p: float = 0.0,
                seed: int = -1, stop: str | Sequence[str] = (), choices: str | Sequence[str] = (),
                mode: str = "") -> dict:
    """A Generate goal's fields, checked here only so far as a value the message cannot carry is one
    line (Invalid) before anything is sent; the server checks the rest (a temperature or top_p out
    of range, a seed below -1, a mode it does not serve, a prompt over its context) and answers
    with Invalid too. Zeros mean the node's default (max_new_tokens), greedy (temperature), off
    (top_k, top_p); seed -1 is random."""
    if not isinstance(prompt, str):
        raise Invalid(f"prompt must be a string, got {type(prompt).__name__}")
    if not isinstance(mode, str):
        raise Invalid(f"mode must be a string, got {mode!r}")
    return {"prompt": prompt, "max_new_tokens": _checked_int("max_new_tokens", max_new_tokens, UINT32),
            "temperature": _checked_float("temperature", temperature), "top_k": _checked_int("top_k", top_k, UINT32),
            "top_p": _checked_float("top_p", top_p), "seed": _checked_int("seed", seed, INT64),
            "stop": _strings("stop", stop), "choices": _strings("choices", choices), "mode": mode}


def result_of(response: Any) -> Result:
    """The Result of a GetResult response. A goal the server aborted or cancelled whose result says OK
    was ended without a result of its own (the embedded runtime's server answers so when its execute
    callback raises): Failed (or Cancelled), never an answer."""
    result = Result.from_msg(response.result)
    if result.status == Status.OK and response.status in (STATUS_ABORTED, STATUS_CANCELED):
        cancelled = response.status == STATUS_CANCELED
        reason = result.finish_reason or ("cancelled" if cancelled else
                                          "error: the server aborted the goal without a result (its execute "
                                          "callback failed; see the server's log)")
        result = dataclasses.replace(result, status=Status.CANCELLED if cancelled else Status.FAILED,
                                     finish_reason=reason)
    return result


class Request:
    """One Generate goal the server took: iterate it for its chunks (streamed requests), ``result()``
    for its Result, ``cancel()`` to stop it. Leaving an iteration before its end cancels the goal."""

    def __init__(self, llm: LLMClient, handle: Any, chunks: queue.SimpleQueue | None, timeout: float) -> None:
        self.llm, self.handle, self._chunks = llm, handle, chunks
        self.timeout = timeout
        self.deadline = time.monotonic() + timeout
        self.id = goals.goal_name(handle)
        self.ended_at: float | None = None  # time.monotonic() when the result (or the failure) came
        self._future = handle.get_result_async()
        self._future.add_done_callback(self._on_done)
        self._result: Result | None = None
        self._error: BaseException | None = None

    def _on_done(self, _future: Any) -> None:
        self.ended_at = time.monotonic()
        if self._chunks is not None:
            self._chunks.put(_DONE)

    def done(self) -> bool:
        """Whether the request has ended (its result, or its failure, is known)."""
        return self._result is not None or self._error is not None

    def cancel(self) -> None:
        """Ask the server to stop the goal; its result (``result()``) then raises Cancelled, with the
        text so far in ``exc.result``. NoAnswer when the server does not answer the cancel in time."""
        goals.cancel_goal(self.handle)

    def result(self) -> Result:
        """The answer, waiting for it until the request's timeout (see the module docstring for how a
        request that fails raises)."""
        if not self.done():
            try:
                left = max(self.deadline - time.monotonic(), 0.0)
                try:
                    response = goals.wait_result(self.llm.client, self.handle, left, result_future=self._future)
                except NoAnswer:
                    raise self._no_answer() from None
                self._finish(result_of(response))
            except BaseException as exc:
                if (error := self._fail(exc)) is exc:
                    raise
                raise error from exc
        return self._settled()

    def __iter__(self) -> Iterator[Chunk]:
        if self._chunks is None:
            raise TypeError("this request was not sent to be streamed: use LLMClient.stream()")
        if self.done():  # read before: nothing more comes (its failure, if it failed)
            self._settled()
            return
        try:
            yield from self._stream(self._chunks)
        finally:
            if not self.done():  # left early: the loop broke, or the caller stopped us
                self._error = RequestError("left before its end")
                self._quiet_cancel()

    def __enter__(self) -> Request:
        return self

    def __exit__(self, *exc: Any) -> None:
        if not self.done():
            self._error = RequestError("left before its end")
            self._quiet_cancel()

    # -- inside ----------------------------------------------------------------------------------
    def _stream(self, chunks: queue.SimpleQueue) -> Iterator[Chunk]:
        watch = goals.ServerWatch(self.llm.client)
        tokens, text = 0, []
        while (item := self._next(chunks, watch)) is not _DONE:
            chunk = Chunk.from_feedback(item[1].feedback, item[0])
            tokens += len(chunk.token_ids)
            text.append(chunk.text)
            yield chunk
        result = self._arrived()
        grace = time.monotonic() + FEEDBACK_GRACE_S
        while tokens < len(result.token_ids) and (item := self._take(chunks, grace - time.monotonic())) is not None:
            chunk = Chunk.from_feedback(item[1].feedback, item[0])
            tokens += len(chunk.token_ids)
            text.append(chunk.text)
            yield chunk
        if tokens < len(result.token_ids):  # never came: the result's own tail
            said = "".join(text)
            yield Chunk(result.token_ids[tokens:], result.text[len(said):] if result.text.startswith(said) else "",
                        at=time.monotonic(), filled=True)
        self._finish(result)
        self._settled()

    def _next(self, chunks: queue.SimpleQueue, watch: goals.ServerWatch) -> Any:
        """The next (arrival time, feedback message), or _DONE; NoAnswer past the deadline, ServerGone when it leaves."""
        while True:
            try:
                return chunks.get(timeout=goals.SLICE_S)
            except queue.Empty:
                pass
            try:
                watch.check(self.id)
                if time.monotonic() >= self.deadline:
                    raise self._no_answer()
            except BaseException as exc:
                if (error := self._fail(exc)) is exc:
                    raise
                raise error from exc

    def _no_answer(self) -> NoAnswer:
        return NoAnswer(f"no result for goal {self.id} of {self.llm.action_name} within {self.timeout:g} s")

    def _arrived(self) -> Result:
        """The result of a done future as a record (raising what ended the request without one)."""
        try:
            return result_of(self._future.result())
        except BaseException as exc:
            if (error := self._fail(exc)) is exc:
                raise
            raise error from exc

    def _take(self, chunks: queue.SimpleQueue, wait_s: float) -> Any:
        try:
            item = chunks.get(timeout=max(wait_s, 0.0))
        except queue.Empty:
            return None
        return None if item is _DONE else item

    def _finish(self, result: Result) -> None:
        if result.status == Status.OK:
            self._result = result
            return
        error = error_for(result.status, result.finish_reason.removeprefix("error: "))
        error.result = result  # type: ignore[attr-defined]
        self._error = error

    def _fail(self, exc: BaseException) -> BaseException:
        """Record why the request ended without a result, and return it (a server gone as ServerGone);
        a timeout or a Ctrl-C cancels the goal."""
        if isinstance(exc, ServerGoneError):
            exc = ServerGone(str(exc))
        elif not isinstance(exc, RequestError):
            self._quiet_cancel()
        self._error = exc
        return exc

    def _settled(self) -> Result:
        if self._error is not None:
            raise self._error
        assert self._result is not None
        return self._result

    def _quiet_cancel(self) -> None:
        try:
            goals.cancel_goal(self.handle, min(goals.CANCEL_TIMEOUT_S, 5.0))
        except Exception:  # noqa: BLE001 - the server is gone or slow; the request is over for us anyway
            pass


class LLMClient:
    """A client of one Generate action (default /edge_llm/generate). It owns a node and a thread
    that spins it (on ``backend``, "zenoh" or "rclpy"; default: the runtime edge_llm_ros.runtime
    picks), or works on ``node``, a node the caller already has and spins. ``timeout``: seconds a
    request waits for its result (each request may say its own); ``connect_timeout``: for a server
    to take a goal. Use it as a context manager, or call close()."""

    def __init__(self, namespace: str = "/edge_llm", *, node: Any = None, action: str = "generate",
                 timeout: float = DEFAULT_TIMEOUT_S, connect_timeout: float = CONNECT_TIMEOUT_S,
                 backend: str | None = None) -> None:
        self.action_name = action if action.startswith("/") else f"{namespace.rstrip('/')}/{action}"
        self.timeout, self.connect_timeout = timeout, connect_timeout
        self.transport: Transport = attach(node) if node is not None else own_node(
            f"edge_llm_client_{os.getpid()}_{next(_names)}", backend=backend)
        try:
            self.Generate = self.transport.action(GENERATE)
            self.client = self.transport.action_client(self.Generate, self.action_name)
        except BaseException:
            self.transport.close()
            raise
        self._closed = False

    @property
    def node(self) -> Any:
        return self.transport.node

    def wait_until_ready(self, timeout: float = 60.0, check: Callable[[], None] | None = None) -> str:
        """Until the action server answers and the node serving it is lifecycle-active (a node that is
        no lifecycle node: once it answers); that node's name. NoAnswer after ``timeout`` seconds;
        ``check`` runs on every look (e.g. to stop at once when the launch died)."""
        deadline = time.monotonic() + timeout
        send_goal = f"{self.action_name}/_action/send_goal"
        while not (self.client.server_is_ready() and (owners := self.transport.servers_of(send_goal))):
            ready.tick(deadline, check, f"no action server {self.action_name} within {timeout:g} s")
        if ready.is_lifecycle_node(self.transport, owners[0]):
            ready.wait_until_active(self.transport, owners[0], timeout, check, deadline)
        return owners[0]

    def wait_until_active(self, node: str, timeout: float = 60.0, check: Callable[[], None] | None = None,
                          deadline: float | None = None) -> None:
        """Until the lifecycle node ``node`` (fully qualified, e.g. /edge_llm/stage_0) is active; NoAnswer
        naming its state after ``timeout`` (or at ``deadline``, a time.monotonic() of a longer wait)."""
        ready.wait_until_active(self.transport, node, timeout, check, deadline)

    def submit(self, prompt: str, *, max_new_tokens: int = 0, temperature: float = 0.0, top_k: int = 0,
               top_p: float = 0.0, seed: int = -1, stop: str | Sequence[str] = (), choices: str | Sequence[str] = (),
               mode: str = "", timeout: float | None = None) -> Request:
        """Send a goal and return its Request once the server took it (fields: :func:`goal_fields`;
        ``timeout``: seconds for its result, None: the client's, math.inf: no limit). Busy when the
        server refuses it, NoAnswer when no server takes it within connect_timeout."""
        return self._send(goal_fields(prompt, max_new_tokens, temperature, top_k, top_p, seed, stop, choices, mode),
                          timeout, streamed=False)

    def stream(self, prompt: str, *, max_new_tokens: int = 0, temperature: float = 0.0, top_k: int = 0,
               top_p: float = 0.0, seed: int = -1, stop: str | Sequence[str] = (), choices: str | Sequence[str] = (),
               mode: str = "", timeout: float | None = None) -> Request:
        """As submit, and the Request yields the answer's chunks as they come."""
        return self._send(goal_fields(prompt, max_new_tokens, temperature, top_k, top_p, seed, stop, choices, mode),
                          timeout, streamed=True)

    def generate(self, prompt: str, *, max_new_tokens: int = 0, temperature: float = 0.0, top_k: int = 0,
                 top_p: float = 0.0, seed: int = -1, stop: str | Sequence[str] = (), choices: str | Sequence[str] = (),
                 mode: str = "", timeout: float | None = None) -> Result:
        """The answer to ``prompt``: submit(...).result()."""
        return self.submit(prompt, max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
                           seed=seed, stop=stop, choices=choices, mode=mode, timeout=timeout).result()

    def _send(self, fields: dict, timeout: float | None, streamed: bool) -> Request:
        if self._closed:
            raise RuntimeError("this LLMClient is closed")
        goal = self.Generate.Goal(**fields)
        chunks: queue.SimpleQueue | None = queue.SimpleQueue() if streamed else None
        on_feedback = (lambda msg: chunks.put((time.monotonic(), msg))) if chunks is not None else None
        handle = goals.send_goal(self.client, goal, on_feedback, self.connect_timeout)
        if not handle.accepted:
            raise Busy(f"{self.action_name} rejected the goal: busy (max_requests running and max_pending waiting)")
        return Request(self, handle, chunks, self.timeout if timeout is None else timeout)

    def close(self) -> None:
        """Free the action client, and the node and its thread when they are this client's own."""
        if self._closed:
            return
        self._closed = True
        self.client.destroy()
        self.transport.close()

    def __enter__(self) -> LLMClient:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


__all__ = ["GENERATE", "LLMClient", "NoAnswer", "Request", "ServerGone", "goal_fields"]
