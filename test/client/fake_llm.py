"""A Generate server in the test process, on a node host's backend, scripted by its prompt, so the
client library is tested against the action protocol itself (no model):

    count N        N feedback messages of one token each (ids 1..N, text "t1 t2 ..."), then OK / eos
    short N K      N tokens in the result, only the first K of them as feedback
    status CODE    ends at once with RequestStatus CODE and finish_reason "error: scripted CODE"
    hold           one token of feedback, then waits for a cancel (CANCELLED) or 30 s (FAILED)
    bare           aborted with an empty result (its code OK), as a server whose callback failed answers
    busy           rejected when sent

Every goal's cancel request is recorded (``cancelled``: prompts whose goal saw one).
"""

from __future__ import annotations

import threading
import time

HOLD_S = 30.0


class FakeLLM:
    def __init__(self, host, namespace: str, lifecycle_node=None) -> None:
        self.host = host
        self.node = lifecycle_node if lifecycle_node is not None else host.Node("fake_llm", namespace=namespace)
        self.Generate = host.action("edge_llm_ros/action/Generate")
        self.RequestStatus = host.message("edge_llm_ros/msg/RequestStatus")
        self.Stats = host.message("edge_llm_ros/msg/InferenceStats")
        self.Header, self.Time = host.message("std_msgs/msg/Header"), host.message("builtin_interfaces/msg/Time")
        self.cancelled: list[str] = []
        self.cancel_seen = threading.Event()
        if host.backend == "rclpy":  # rclpy's own server, goals in a reentrant group (the host spins 4 threads)
            from functools import partial

            from rclpy.action import ActionServer as RclpyServer
            from rclpy.action import CancelResponse, GoalResponse
            from rclpy.callback_groups import ReentrantCallbackGroup

            ActionServer = partial(RclpyServer, callback_group=ReentrantCallbackGroup())
        else:
            from edge_llm_ros.runtime.actions import ActionServer, CancelResponse, GoalResponse
        self._accept, self._reject, self._cancel_ok = GoalResponse.ACCEPT, GoalResponse.REJECT, CancelResponse.ACCEPT
        self.server = ActionServer(self.node, self.Generate, "generate", self.execute,
                                   goal_callback=self.on_goal, cancel_callback=lambda _: self._cancel_ok)

    def on_goal(self, goal):
        return self._reject if goal.prompt == "busy" else self._accept

    def result(self, tokens, code=0, reason="eos", text=None):
        stats = self.Stats(header=self.Header(stamp=self.Time(sec=1700000000, nanosec=250000000)), node_name="fake_llm", request_id="r1", mode="ar", backend="llama.cpp", tokens=len(tokens),
                           tokens_per_s=12.5, ttft_s=0.25, alt=1.5, alr=2.25, drafts=3, draft_forwards=7,
                           draft_time_s=0.5, draft_time_is_cpu=True, ignored_results=2)
        text = " ".join(f"t{t}" for t in tokens) if text is None else text
        return self.Generate.Result(text=text, token_ids=list(tokens), finish_reason=reason,
                                    status=self.RequestStatus(code=code), stats=stats)

    def feedback(self, handle, tokens, first: bool) -> None:
        text = ("" if first else " ") + " ".join(f"t{t}" for t in tokens)
        handle.publish_feedback(self.Generate.Feedback(token_ids=list(tokens), text_delta=text,
                                                       probs=[0.5] * len(tokens)))

    def execute(self, handle):
        words = handle.request.prompt.split()
        if words[0] == "count":
            tokens = list(range(1, int(words[1]) + 1))
            for i, t in enumerate(tokens):
                self.feedback(handle, [t], i == 0)
            handle.succeed()
            return self.result(tokens)
        if words[0] == "short":
            tokens = list(range(1, int(words[1]) + 1))
            for i, t in enumerate(tokens[: int(words[2])]):
                self.feedback(handle, [t], i == 0)
            handle.succeed()
            return self.result(tokens, reason="length")
        if words[0] == "status":
            handle.abort()
            return self.result([], code=int(words[1]), reason=f"error: scripted {words[1]}")
        if words[0] == "bare":
            handle.abort()
            return self.Generate.Result()
        if words[0] == "hold":
            self.feedback(handle, [1], True)
            deadline = time.monotonic() + HOLD_S
            while not handle.is_cancel_requested and time.monotonic() < deadline:
                time.sleep(0.02)
            if handle.is_cancel_requested:
                self.cancelled.append(handle.request.prompt)
                self.cancel_seen.set()
                handle.canceled()
                return self.result([1], code=6, reason="cancelled", text="t1")
            handle.abort()
            return self.result([1], code=7, reason="error: never cancelled")
        handle.abort()
        return self.result([], code=3, reason=f"error: unknown script {handle.request.prompt!r}")

    def close(self) -> None:
        if self.host.backend == "rclpy":  # rclpy's server frees its handle before it leaves the node
            self.host.between_turns(self._close, "the fake server")
        else:
            self._close()

    def _close(self) -> None:
        self.server.destroy()
        if self.host.backend == "rclpy":
            self.host.executor.remove_node(self.node)  # first: the executor must not wait on its entities
        self.node.destroy_node()
