"""echo_node: answers each instruction by streaming it back word by word.

The stand-in for the generation pipeline until the engine lands: it keeps
the topic contract the real pipeline keeps (`instruction` in, `response` as
TokenChunk stream out, `stats`, and the `generate` action).

Parameters: chunk_words (words per TokenChunk), stats_period_s.
"""

from __future__ import annotations

import dataclasses
import time
import uuid

from edge_llm_ros import runtime as rt
from edge_llm_ros.nodes.common import run_node, stamp
from edge_llm_ros.nodes.diagnostics import OK, Status, Updater
from edge_llm_ros.nodes.parameters import declare, param


def chunks(text: str, size: int) -> list[str]:
    """Split text into pieces of `size` words that concatenate back to the text."""
    words = text.split(" ")
    pieces = [" ".join(words[i:i + size]) for i in range(0, len(words), size)]
    return [p + (" " if i < len(pieces) - 1 else "") for i, p in enumerate(pieces)]


@dataclasses.dataclass(frozen=True)
class EchoParams:
    chunk_words: int = param(1, "words per TokenChunk", low=1, high=1_000_000)
    stats_period_s: float = param(1.0, "period of the InferenceStats on stats", low=0.001)


class EchoNode(rt.Node):
    def __init__(self) -> None:
        super().__init__("echo_node", namespace="edge_llm")
        params = declare(self, EchoParams)
        self.chunk_words, period = params.chunk_words, params.stats_period_s
        self.String = rt.message("std_msgs/msg/String")
        self.TokenChunk = rt.message("edge_llm_ros/msg/TokenChunk")
        self.Stats = rt.message("edge_llm_ros/msg/InferenceStats")
        self.Generate = rt.action("edge_llm_ros/action/Generate")
        self.response_pub = self.create_publisher(self.TokenChunk, "response", 100)
        self.stats_pub = self.create_publisher(self.Stats, "stats", 10)
        self.create_subscription(self.String, "instruction", self.on_instruction, 10)
        self.action_server = rt.ActionServer(self, self.Generate, "generate", self.execute)
        self.create_timer(period, self.publish_stats)
        self.requests = 0
        self.words = 0
        topics = [self.resolve_topic_name(t) for t in ("instruction", "response")]
        self.diagnostics = Updater(self, hardware_id=f"{self.get_fully_qualified_name()} (echo)")
        self.diagnostics.add("requests", self.diagnose)
        self.get_logger().info(f"echoing {topics[0]} -> {topics[1]}")

    def diagnose(self, status: Status) -> None:
        status.summary(OK, f"echoing, {self.requests} instruction(s) so far")
        status.add("lifecycle state", "active")  # not a managed node: always serving
        status.add("mode", "echo")
        status.add("requests", self.requests)
        status.add("words echoed", self.words)

    def on_instruction(self, msg) -> None:
        request_id = uuid.uuid4().hex[:12]
        pieces = chunks(msg.data, self.chunk_words)
        for round_, piece in enumerate(pieces):
            done = round_ == len(pieces) - 1
            self.response_pub.publish(stamp(self, self.TokenChunk(
                request_id=request_id, round=round_, text=piece, done=done, finish_reason="eos" if done else "",
            )))
        self.requests += 1
        self.words += len(msg.data.split())
        self.get_logger().info(f"request {request_id}: echoed {len(pieces)} chunks")

    def execute(self, goal_handle):
        started = time.monotonic()
        pieces = chunks(goal_handle.request.prompt, self.chunk_words)
        limit = goal_handle.request.max_new_tokens or len(pieces)
        text = ""
        for piece in pieces[:limit]:
            if goal_handle.is_cancel_requested:
                goal_handle.canceled()
                return self.Generate.Result(text=text, finish_reason="cancelled")
            goal_handle.publish_feedback(self.Generate.Feedback(text_delta=piece))
            text += piece
        goal_handle.succeed()
        elapsed = time.monotonic() - started
        stats = stamp(self, self.Stats(node_name=self.get_name(), mode="echo", tokens=min(limit, len(pieces)),
                                       tokens_per_s=min(limit, len(pieces)) / max(elapsed, 1e-9)))
        return self.Generate.Result(text=text, finish_reason="length" if limit < len(pieces) else "eos", stats=stats)

    def publish_stats(self) -> None:
        self.stats_pub.publish(stamp(self, self.Stats(node_name=self.get_name(), mode="echo", tokens=self.words,
                                                      active_requests=0)))


def main(args: list[str] | None = None) -> int:
    return run_node(EchoNode, args)


if __name__ == "__main__":
    raise SystemExit(main())
