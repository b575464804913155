"""The draft side's end of the stage pipeline (FlowSpec's D0): what the pipeline backend
(nodes/backends/pipeline.py) drives.

A request is a core.pipeline scheduler (ar, chunk_pp or flowspec; an outline request is several,
driven at once by :meth:`StageClient.run_many`). Its rows go to the first stage
on `stage_0/in` (HiddenStates, token ids), its prunes and, at the end, a release to every stage on
`prune`; the last stage's answers come back on `stage_<count>/in` (the target's greedy token per
row) and the stages' refusals on `verify` (a final VerifyResult with `error`, routed here by the
node). :meth:`StageClient.run` yields the tokens each answer commits. Every HiddenStates names the
prune publisher (`prune_gid`): the stages bind a request to it and to the rows' publisher with its
first rows and take its PruneInfos from nobody else (nodes/ownership.py).

A request never hangs: with no answer for `timeout_s` it ends with an error naming the stages that
nothing serves any more (no subscriber on their topic), checked every second as well, so a
dead stage ends its requests within about two seconds, and one that died and came back (a respawn
takes a second or two: its subscription is gone at one check and back at the next) at once.
"""

from __future__ import annotations

import queue
from collections.abc import Iterator
from dataclasses import dataclass, field

from edge_llm_ros import runtime as rt
from edge_llm_ros.errors import PeerGone, PeerTimeout
from edge_llm_ros.nodes.common import MatchGate, stamp
from edge_llm_ros.nodes.edge_link import await_answer
from edge_llm_ros.nodes.ownership import gid_field


class StageFailed(PeerGone):
    """A stage refused the request's rows, answered with what is not an answer, or is gone."""


class StageTimeout(PeerTimeout):
    """Nothing answered within timeout_s."""


class StageClient:
    def __init__(self, node, count: int, timeout_s: float, inboxes: dict, prune_pub) -> None:
        self.node, self.count, self.timeout_s = node, count, timeout_s
        self.inboxes, self.prune_pub = inboxes, prune_pub  # shared with the node: `verify` errors land there
        self.prune_gid = gid_field(rt.publisher_gid(prune_pub))  # what every message names as its pruner
        self.HiddenStates = rt.message("edge_llm_ros/msg/HiddenStates")
        self.PruneInfo = rt.message("edge_llm_ros/msg/PruneInfo")
        self.rows_pub = rt.shaped(node, node.create_publisher(self.HiddenStates, "stage_0/in", 100))
        self.rows_gate = MatchGate(node, self.rows_pub)
        self.answers = node.create_subscription(self.HiddenStates, f"stage_{count}/in", self.on_answer, 100)

    def describe(self) -> str:
        resolve = self.node.resolve_topic_name
        return f"{resolve('stage_0/in')} -> {self.count} stage(s) -> {resolve(f'stage_{self.count}/in')}"

    def on_answer(self, msg) -> None:
        inbox = self.inboxes.get(msg.request_id)
        if inbox is not None:
            inbox.put(msg)

    def run(self, scheduler) -> Iterator[list[int]]:
        """Drive one request: yield the tokens each answer commits, until the scheduler finishes.
        StageFailed if a stage refuses it, dies, or nothing answers within timeout_s."""
        for _, tokens in self.run_many([scheduler]):
            yield tokens

    def run_many(self, schedulers: list, release: tuple[str, ...] = (),
                 release_own: bool = True) -> Iterator[tuple[int, list[int]]]:
        """Drive several requests at once through the stages (their rows interleave, so every stage
        has work): yield (index, tokens) as answers commit them, until every scheduler finished. At
        the end every request is released (unless ``release_own`` is false: another request forks it
        next), and so are the ids in ``release`` (a request they forked from: its cache is needed
        until their forks are applied, which the stages do in order)."""
        from edge_llm_ros.core.edge_cloud import VerifyOutcome
        from edge_llm_ros.core.pipeline.schedulers import Output
        from edge_llm_ros.nodes.wire import StageMessage, WireError

        inbox: queue.Queue = queue.Queue()
        absent: set[int] = set()  # stages seen without a subscriber while these requests ran
        index = {s.request_id: i for i, s in enumerate(schedulers)}
        for rid in index:
            self.inboxes[rid] = inbox
        try:
            for scheduler in schedulers:
                self.act(scheduler.start())
            while not all(s.finished for s in schedulers):
                msg = self.wait(inbox, sum(len(s.generated) for s in schedulers), absent)
                if isinstance(msg, VerifyOutcome):  # a stage's refusal, from the node's `verify`
                    raise StageFailed(msg.error or "a stage answered with an empty error", msg.status)
                scheduler = schedulers[index[msg.request_id]]
                try:
                    answer = StageMessage.from_msg(msg)
                    choices = answer.to_rows(None).data.tolist()
                except WireError as exc:
                    raise StageFailed(f"the last stage's answer is malformed: {exc} (is `output` argmax?)") from exc
                actions = scheduler.on_output(Output(answer.request_id, answer.round, answer.prefix_len,
                                                     answer.first_row, choices, answer.choice_probs or None))
                self.act(actions)
                if actions.tokens:
                    yield index[msg.request_id], actions.tokens
        finally:
            for rid in index:
                self.inboxes.pop(rid, None)
            for rid in [*(index if release_own else ()), *release]:
                self.release(rid)

    def release(self, request_id: str) -> None:
        """Free a request's caches on every stage."""
        self.prune_pub.publish(stamp(self.node, self.PruneInfo(request_id=request_id, release=True)))

    def act(self, actions) -> None:
        """Prunes first (rows sent after them wait for them at each stage), then the rows."""
        from edge_llm_ros.nodes.wire import StageMessage

        for prune in actions.prunes:
            self.prune_pub.publish(stamp(self.node, self.PruneInfo(
                request_id=prune.request_id, round=prune.step, prefix_len=prune.prefix_len, keep=list(prune.keep),
                committed=prune.committed, fork_from=prune.fork_from)))
        for rows in actions.inject:
            self.rows_gate.wait()
            self.rows_pub.publish(stamp(self.node, self.HiddenStates(**StageMessage.from_rows(rows, 0).fields(),
                                                                     prune_gid=self.prune_gid)))

    def wait(self, inbox: queue.Queue, tokens: int, absent: set[int]):
        """The request's next answer or refusal (nodes/edge_link.await_answer): StageTimeout after
        timeout_s; StageFailed once a stage has no subscriber, or at once when a stage that had none
        earlier in this request (``absent``) has one again: it died and restarted (a respawn takes a
        second or two), and the request's caches and rows in flight died with it."""
        def restarted() -> None:
            back = {i for i in absent if self.node.count_subscribers(f"stage_{i}/in") > 0}
            if back:
                raise StageFailed(f"{self.names(back)} gone: it died and restarted while the request ran, its "
                                  f"caches with it ({tokens} token(s) committed)")

        def gone() -> str:
            missing = {i for i in range(self.count) if self.node.count_subscribers(f"stage_{i}/in") == 0}
            absent.update(missing)
            return self.names(missing)

        return await_answer(
            inbox, self.timeout_s, gone,
            lambda: StageTimeout(f"no answer from the last stage within timeout_s={self.timeout_s:g} s ({tokens} "
                                 f"token(s) committed): are {self.count} stage_node(s) running?"),
            lambda who: StageFailed(f"{who} gone: nothing subscribes to its input any more (it died or is "
                                    f"restarting; {tokens} token(s) committed)"), restarted)

    def names(self, stages) -> str:
        """e.g. 'stage 1 (/edge_llm/stage_1/in)'."""
        return ", ".join(f"stage {i} ({self.node.resolve_topic_name(f'stage_{i}/in')})" for i in sorted(stages))


@dataclass
class PipelineStats:
    """A finished request's numbers in the shape draft_node's stats read (EE's fields stay empty)."""

    accepted: list[int]  # drafted tokens accepted per pipeline turn (mean_tau adds the target's own: tau = ALT)
    alt: float = 0.0
    alr: float = 0.0
    hits: int = 0
    misses: int = 0
    hit_layers: list[int] = field(default_factory=list)
    critical_draft_s: float = 0.0
    verify_s: float = 0.0
    ignored: dict = field(default_factory=dict)


def scheduler_stats(scheduler) -> PipelineStats:
    return PipelineStats([n - 1 for n in scheduler.per_turn], scheduler.alt, scheduler.alr)
