"""MatchGate (nodes/common.py): a message waits until the publisher reaches every subscription the
graph shows, for at most wait_s; one that never matches costs wait_s once, with a warning, and the
gate waits again only when the count of subscriptions changes. Here on a scripted graph; through
processes, test_edge_cloud_nodes' killed-verifier test sends to a verifier that has just started."""

from __future__ import annotations

import threading

from edge_llm_ros.nodes.common import MatchGate


class Logger:
    def __init__(self) -> None:
        self.warnings: list[str] = []

    def warning(self, line: str) -> None:
        self.warnings.append(line)


class Graph:
    """A node and its publisher whose counts the test sets: ``shown`` subscriptions in the graph,
    ``matched`` of them reached by the writer. Each time the gate reads the writer's count,
    ``on_read`` runs (the test's way to let DDS match during a wait)."""

    topic_name = "/edge_llm/draft"

    def __init__(self, shown: int, matched: int) -> None:
        self.shown, self.matched, self.reads, self.logger = shown, matched, 0, Logger()
        self.on_read = lambda reads: None

    def resolve_topic_name(self, topic: str) -> str:
        return topic

    def count_subscribers(self, topic: str) -> int:
        assert topic == self.topic_name
        return self.shown

    def get_subscription_count(self) -> int:
        self.reads += 1
        self.on_read(self.reads)
        return self.matched

    def get_logger(self) -> Logger:
        return self.logger


def test_a_matched_writer_passes_at_once():
    graph = Graph(shown=2, matched=2)
    assert MatchGate(graph, graph, wait_s=30.0).wait()
    assert graph.reads == 1 and not graph.logger.warnings


def test_no_subscription_at_all_passes_at_once():
    """Nothing to wait for: the caller's own dead-peer check reports it."""
    graph = Graph(shown=0, matched=0)
    assert MatchGate(graph, graph, wait_s=30.0).wait()
    assert not graph.logger.warnings


def test_a_subscription_shown_before_it_is_matched_holds_the_message_until_it_is():
    graph = Graph(shown=2, matched=1)  # a killed verifier's reader still matched, the new one not yet

    def match_later(reads: int) -> None:
        if reads == 5:
            graph.matched = 2

    graph.on_read = match_later
    assert MatchGate(graph, graph, wait_s=30.0).wait()
    assert graph.reads == 5 and not graph.logger.warnings


def test_a_subscription_that_never_matches_costs_wait_s_once_then_again_only_when_the_graph_changes():
    graph = Graph(shown=3, matched=2)
    gate = MatchGate(graph, graph, wait_s=0.05)
    assert not gate.wait()
    assert len(graph.logger.warnings) == 1
    assert "the graph shows 3 subscription(s), the publisher reaches 2 after 0.05 s" in graph.logger.warnings[0]
    reads = graph.reads
    assert gate.wait() and graph.reads == reads  # same graph: no second wait
    graph.shown = 4  # another subscription appears: waited for again
    done = threading.Event()
    graph.on_read = lambda _: done.set()
    assert not gate.wait() and done.is_set()
    assert len(graph.logger.warnings) == 2
