"""The fleet of ``bench --scenario reliability``: this process as robots' applications against the
launched edge-cloud deployment. :class:`Fleet` holds LLMClients (edge_llm_ros.client) on one node of
the embedded runtime, a raw publisher per fuzzed topic, listeners on `verify` and `response`, and
on each peer's lifecycle transitions; a goal it sends is a :class:`GoalRun`, followed to its end
on a thread of its own. :class:`References` computes the target's own greedy output to compare
with, and :func:`exact` compares.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from edge_llm_ros.errors import Status
from edge_llm_ros.tools.deployment import Deployment
from edge_llm_ros.tools.fuzz import TOPICS
from edge_llm_ros.tools.generate import one_line
from edge_llm_ros.tools.loading import ToolError

NAMESPACE = "/edge_llm"
PEERS = ("verifier_node", "draft_node")
MAX_NEW_TOKENS = 16
START_TIMEOUT_S = 300.0
ACTIVE = 3  # lifecycle_msgs/msg/State.PRIMARY_STATE_ACTIVE


@dataclass
class GoalRun:
    prompt: str
    max_new_tokens: int = MAX_NEW_TOKENS
    status: int | None = None  # its RequestStatus code (errors.Status); None: rejected, or no result
    accepted: bool = False
    tokens: list[int] = field(default_factory=list)
    reason: str = ""
    error: str = ""
    hung: bool = False  # accepted, and no result (nor a failure) within its deadline
    wall_s: float = 0.0
    first_feedback: threading.Event = field(default_factory=threading.Event)
    ended: threading.Event = field(default_factory=threading.Event)  # its result, failure or timeout is in


class Fleet:
    """This process as robots' applications: LLMClients (each its own action client) on one node, a
    raw publisher per fuzzed topic, listeners on `verify` and `response` to check that every refused
    input was answered, and on each peer's lifecycle transitions (when it became active)."""

    def __init__(self, clients: int = 1) -> None:
        from edge_llm_ros.client import LLMClient
        from edge_llm_ros.runtime import message
        from edge_llm_ros.runtime.cli import Session

        self.session = Session()
        self.node = self.session.node
        self.node.get_logger().set_level("fatal")  # the fuzz we send also reaches our own listener: no echo
        self.activations: dict[str, list[float]] = {name: [] for name in PEERS}  # time.monotonic() of each
        for name in PEERS:
            self.node.create_subscription(message("lifecycle_msgs/msg/TransitionEvent"),
                                          f"{NAMESPACE}/{name}/transition_event",
                                          lambda msg, name=name: self._on_transition(name, msg), 10)
        self.clients = [LLMClient(NAMESPACE, node=self.node, connect_timeout=30.0) for _ in range(max(1, clients))]
        self.publishers = {topic: self.node.create_publisher(message(ros_type), f"{NAMESPACE}/{topic}", 1000)
                           for topic, ros_type in TOPICS.items()}
        self._lock = threading.Lock()
        self.errors: dict[str, list[str]] = {}  # request id -> VerifyResult.error of its final rejections
        self.answered: set[str] = set()  # request ids with a final VerifyResult
        self.done_chunks = 0
        self.node.create_subscription(message("edge_llm_ros/msg/VerifyResult"), f"{NAMESPACE}/verify",
                                      self._on_verify, 1000)
        self.node.create_subscription(message("edge_llm_ros/msg/TokenChunk"), f"{NAMESPACE}/response",
                                      self._on_chunk, 1000)

    def _on_transition(self, name: str, msg) -> None:
        if msg.goal_state.id == ACTIVE:
            with self._lock:
                self.activations[name].append(time.monotonic())

    def activated(self, name: str, since: float, timeout: float) -> float:
        """When ``name`` first became active at or after ``since`` (waiting up to ``timeout`` for it)."""
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                times = [t for t in self.activations[name] if t >= since]
            if times:
                return times[0]
            if time.monotonic() > deadline:
                raise ToolError(f"{name} did not become active within {timeout:g} s (no lifecycle transition event "
                                f"to active heard on {NAMESPACE}/{name}/transition_event)")
            time.sleep(0.05)

    def _on_verify(self, msg) -> None:
        if msg.final:
            with self._lock:
                self.answered.add(msg.request_id)
                if msg.error:
                    self.errors.setdefault(msg.request_id, []).append(msg.error)

    def _on_chunk(self, msg) -> None:
        if msg.done:
            with self._lock:
                self.done_chunks += 1

    def wait_ready(self, deployment: Deployment, timeout: float = START_TIMEOUT_S) -> None:
        """Until verifier_node and draft_node (serving generate) are lifecycle-active, and the graph shows
        draft_node on `draft` and on `verify` beside us."""
        deadline = time.monotonic() + timeout
        llm = self.clients[0]
        llm.wait_until_active(f"{NAMESPACE}/verifier_node", timeout, check=lambda: alive(deployment))
        llm.wait_until_ready(max(deadline - time.monotonic(), 0.0), check=lambda: alive(deployment))
        while not (self.node.count_subscribers(f"{NAMESPACE}/draft") >= 1
                   and self.node.count_subscribers(f"{NAMESPACE}/verify") >= 2):  # draft_node and us
            alive(deployment)
            if time.monotonic() > deadline:
                raise ToolError(f"the nodes were not ready within {timeout:g} s; last lines:\n{deployment.log.tail()}")
            time.sleep(0.2)

    def send(self, prompt: str, deadline_s: float, client: int = 0, **goal) -> GoalRun:
        """Send a goal, streamed; a thread follows it to its end (``run.ended``). A goal refused as busy
        is not accepted and has no error; one no server took has the error."""
        from edge_llm_ros.errors import Busy

        goal.setdefault("max_new_tokens", MAX_NEW_TOKENS)
        run = GoalRun(prompt, goal["max_new_tokens"])
        start = time.monotonic()
        try:
            request = self.clients[client % len(self.clients)].stream(prompt, timeout=deadline_s, **goal)
        except Busy:
            pass
        except Exception as exc:  # no server took the goal (one still leaving the graph, or not up yet)
            run.error = one_line(exc)
        else:
            run.accepted = True
            threading.Thread(target=self._follow, args=(run, request, start), daemon=True, name="goal").start()
            return run
        run.wall_s = time.monotonic() - start
        run.ended.set()
        return run

    @staticmethod
    def _follow(run: GoalRun, request, start: float) -> None:
        """Read an accepted goal's chunks and its end into ``run``."""
        from edge_llm_ros.client import NoAnswer
        from edge_llm_ros.errors import RequestError

        try:
            for _ in request:
                run.first_feedback.set()
            result = request.result()
            run.status, run.tokens, run.reason = int(result.status), result.token_ids, result.finish_reason
        except NoAnswer as exc:  # no result within its deadline (the client cancelled it)
            run.hung, run.error = True, one_line(exc)
        except RequestError as exc:  # a result that is not an answer, or the server went away
            answer = getattr(exc, "result", None)
            if answer is None:
                run.error = one_line(exc)
            else:
                run.status, run.tokens, run.reason = int(exc.status), answer.token_ids, answer.finish_reason
        except Exception as exc:  # the call itself failed
            run.error = one_line(exc)
        finally:
            run.wall_s = time.monotonic() - start
            run.ended.set()

    @staticmethod
    def finish(run: GoalRun, deadline_s: float) -> GoalRun:
        """A sent goal once it has ended (its client gives up at ``deadline_s``; a goal that still has not
        ended a minute later counts as hung)."""
        if not run.ended.wait(deadline_s + 60.0):
            run.hung, run.error = True, f"not ended within {deadline_s:g} s"
        return run

    def generate(self, prompt: str, deadline_s: float, client: int = 0, **goal) -> GoalRun:
        return self.finish(self.send(prompt, deadline_s, client, **goal), deadline_s)

    def publish_raw(self, topic: str, data: bytes) -> None:
        self.publishers[topic].publish_raw(data)

    def close(self) -> None:
        for client in self.clients:
            client.close()
        self.session.close()


def alive(deployment: Deployment) -> None:
    """ToolError when the deployment has stopped."""
    if not deployment.alive():
        raise ToolError(f"the deployment stopped; last lines:\n{deployment.log.tail()}")


class References:
    """The target's own greedy output per (prompt, max_new_tokens) (core generate_all, mode ar),
    computed here once each."""

    def __init__(self) -> None:
        self._done: dict[tuple[str, int], list[int]] = {}
        self._target = None

    def __call__(self, prompt: str, max_new_tokens: int = MAX_NEW_TOKENS) -> list[int]:
        if (prompt, max_new_tokens) not in self._done:
            from edge_llm_ros.core.engine.config import GenerationConfig
            from edge_llm_ros.core.engine.decoding import generate_all
            from edge_llm_ros.core.engine.models import chat_prompt, load_model

            if self._target is None:
                self._target = load_model()
            self._done[prompt, max_new_tokens] = generate_all(
                self._target, chat_prompt(self._target.tokenizer, prompt),
                GenerationConfig(mode="ar", max_new_tokens=max_new_tokens)).tokens
        return self._done[prompt, max_new_tokens]


def exact(run: GoalRun, references: References) -> bool:
    return run.status == Status.OK and run.tokens == references(run.prompt, run.max_new_tokens)


def output(run: GoalRun) -> dict:
    """What a goal asked and returned, for the report (a test compares it with its own reference)."""
    return {"prompt": run.prompt, "max_new_tokens": run.max_new_tokens, "status": run.status, "tokens": run.tokens}
