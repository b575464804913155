"""NavigatorClient: send the robot an instruction and wait for its episode to end.

    with NavigatorClient() as nav:
        nav.wait_until_ready(120)
        episode = nav.navigate("go to the red chair", timeout=300)
        print(episode.outcome, episode.actions, episode.waiting_s)

navigator_node (namespace /edge_llm, name navigator by default) starts an episode on every
instruction it hears on ``<namespace>/instruction`` (a new one replaces the running one, an empty
one stops the robot) and, when the episode ends, publishes its summary latched on
``<namespace>/<navigator>/episode`` (std_msgs/String, JSON). :meth:`NavigatorClient.navigate`
publishes the instruction and returns the first summary of an episode newer than the last one
this client had seen, for that instruction, as an :class:`Episode`; NoAnswer after its timeout.
The summary names the instruction, not who sent it: two programs that send the same instruction
at once cannot tell their episodes apart; and a navigator that restarts numbers its episodes
from 1 again, so a client made before the restart waits in vain (make a new one).
"""

from __future__ import annotations

import itertools
import math
import os
import threading
import time
from typing import Any, Callable

from edge_llm_ros.client import ready
from edge_llm_ros.client.records import Episode
from edge_llm_ros.client.transport import Transport, attach, own_node
from edge_llm_ros.errors import Invalid
from edge_llm_ros.runtime.goals import NoAnswer

EPISODE_TIMEOUT_S = 600.0
LATCHED_WAIT_S = 1.0  # a fresh client's first navigate: how long the last episode's latched summary may take
_names = itertools.count()


class NavigatorClient:
    """A client of one navigator_node: navigate, stop, wait_until_ready. It owns a node and a
    thread that spins it (on ``backend``, as LLMClient's), or works on ``node`` (the caller's,
    spun by the caller)."""

    def __init__(self, namespace: str = "/edge_llm", *, navigator: str = "navigator", node: Any = None,
                 backend: str | None = None) -> None:
        ns = namespace.rstrip("/")
        self.navigator = f"{ns}/{navigator}"
        self.instruction_topic, self.episode_topic = f"{ns}/instruction", f"{self.navigator}/episode"
        self.transport: Transport = attach(node) if node is not None else own_node(
            f"edge_llm_navigator_client_{os.getpid()}_{next(_names)}", backend=backend)
        self._cond = threading.Condition()
        self.episodes: list[Episode] = []  # every summary heard, in order
        self.malformed: list[str] = []  # summaries that did not parse (why)
        self._sent_after = -math.inf  # the newest episode number seen when the last instruction went out
        try:
            String = self.transport.message("std_msgs/msg/String")
            self._String = String
            self._pub = self.transport.node.create_publisher(String, self.instruction_topic, 10)
            self._sub = self.transport.node.create_subscription(String, self.episode_topic, self._on_episode,
                                                                self.transport.latched_qos())
        except BaseException:
            self.transport.close()
            raise

    @property
    def node(self) -> Any:
        return self.transport.node

    def _on_episode(self, msg: Any) -> None:
        try:
            episode = Episode.from_json(msg.data)
        except ValueError as exc:
            with self._cond:
                self.malformed.append(str(exc))
            return
        with self._cond:
            self.episodes.append(episode)
            self._cond.notify_all()

    def last_episode(self) -> Episode | None:
        with self._cond:
            return self.episodes[-1] if self.episodes else None

    def wait_until_ready(self, timeout: float = 120.0, check: Callable[[], None] | None = None) -> None:
        """Until the navigator is lifecycle-active and hears ``instruction``; NoAnswer after ``timeout``."""
        deadline = time.monotonic() + timeout
        ready.wait_until_active(self.transport, self.navigator, timeout, check)
        while self.navigator not in self.transport.subscribers_of(self.instruction_topic):
            ready.tick(deadline, check, f"nothing subscribes to {self.instruction_topic} after {timeout:g} s")

    def navigate(self, instruction: str, timeout: float = EPISODE_TIMEOUT_S,
                 check: Callable[[], None] | None = None) -> Episode:
        """Send ``instruction`` and wait for its episode's summary (any outcome: a stop, a failure, or
        ``replaced`` when another instruction came first). NoAnswer after ``timeout`` seconds (the
        robot goes on: call stop())."""
        if not isinstance(instruction, str) or not instruction.strip():
            raise Invalid(f"instruction must be a non-empty string (stop() ends an episode), got {instruction!r}")
        text = instruction.strip()  # as the navigator keeps it
        self._publish(instruction, deadline=time.monotonic() + min(timeout, 10.0), before=self._latest)
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                found = [e for e in self.episodes if e.episode > self._sent_after and e.instruction == text]
                if found:
                    return found[0]
                left = deadline - time.monotonic()
                if left <= 0:
                    raise NoAnswer(f"no episode summary for {text!r} on {self.episode_topic} within {timeout:g} s")
                self._cond.wait(min(left, ready.LOOK_S))
                if check is not None:
                    check()

    def stop(self) -> None:
        """End the running episode: an empty instruction (the navigator stops the robot)."""
        self._publish("", deadline=time.monotonic() + 10.0, before=self._latest)

    def _latest(self) -> None:
        """Note the newest episode the navigator had ended before this instruction (its latched
        summary: a fresh client waits up to LATCHED_WAIT_S for it), so that an older summary of the
        same instruction is never taken for the new one."""
        deadline = time.monotonic() + LATCHED_WAIT_S
        with self._cond:
            while not self.episodes and time.monotonic() < deadline:
                self._cond.wait(deadline - time.monotonic())
            self._sent_after = max((e.episode for e in self.episodes), default=-math.inf)

    def _publish(self, text: str, deadline: float, before: Callable[[], None]) -> None:
        """Publish on instruction once the navigator subscribes to it and our publisher is matched (a
        message sent before would be lost); ``before()`` runs just before. NoAnswer when the
        navigator does not subscribe before ``deadline``."""
        while not (self.navigator in self.transport.subscribers_of(self.instruction_topic)
                   and self._pub.get_subscription_count() >= 1):
            ready.tick(deadline, None, f"{self.navigator} does not subscribe to {self.instruction_topic}")
        before()
        self._pub.publish(self._String(data=text))

    def close(self) -> None:
        self.transport.node.destroy_subscription(self._sub)
        self.transport.node.destroy_publisher(self._pub)
        self.transport.close()

    def __enter__(self) -> NavigatorClient:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


__all__ = ["EPISODE_TIMEOUT_S", "NavigatorClient"]
