"""The robot's end of the edge-cloud link, for any node that drafts for a verifier_node.

:class:`VerifierLink` publishes DraftTrees on `draft` (shaped: links are emulated in the runtime),
takes VerifyResults from `verify` (early ones to the robot's EarlyExitDrafter, which pre-drafts
from them; finals to their request's inbox) and releases a finished request's cache on the
verifier with a PruneInfo on `prune`. Every DraftTree names that prune publisher (`prune_gid`): the
verifier binds a request to it and to the draft publisher at round 0 and takes the request's
PruneInfos from nobody else (nodes/ownership.py). :meth:`VerifierLink.rounds` runs one request's rounds
(core's robot_rounds) over it. A request never hangs: without a final outcome for `timeout_s`, or
once no verifier subscribes to `draft` any more, it ends with :class:`VerifierTimeout`.

Round 0 is resent (after 1, 3, 7, ... s) until the verifier answers anything of the request: a verifier
that has just (re)started may not have matched this node's writer yet (DDS shows it in the graph
first; Zenoh propagates a new subscription to the router first), and what is published before that
reaches nobody. The verifier answers a repeated draft with the final outcome it already sent.

Used by draft_node (text) and navigator_node (navigation decisions, task "nav").
"""

from __future__ import annotations

import queue
import time

from edge_llm_ros import runtime as rt
from edge_llm_ros.errors import PeerGone, PeerTimeout
from edge_llm_ros.nodes.common import MatchGate, stamp
from edge_llm_ros.nodes.diagnostics import Window
from edge_llm_ros.nodes.ownership import gid_field
from edge_llm_ros.nodes.wire import from_message, to_message

PEER_CHECK_S = 1.0  # while waiting for a final outcome, check this often that a verifier is still there


class VerifierTimeout(PeerTimeout):
    """No final VerifyResult within timeout_s."""


class VerifierGone(PeerGone):
    """No verifier subscribes to `draft` any more."""


def await_answer(inbox: queue.Queue, timeout_s: float, gone, timed_out, vanished, idle=None):
    """The next item of ``inbox``. Raises ``vanished(who)`` once ``gone()`` names a missing peer
    in two checks PEER_CHECK_S apart (one graph snapshot may lag behind a subscription that
    already works), else ``timed_out()`` after ``timeout_s``: a request never hangs on a peer.
    ``idle()``, if given, runs after each PEER_CHECK_S without an item."""
    deadline, absent = time.monotonic() + timeout_s, 0
    while True:
        try:
            return inbox.get(timeout=max(0.0, min(PEER_CHECK_S, deadline - time.monotonic())))
        except queue.Empty:
            pass
        if idle is not None:
            idle()
        who = gone()
        absent = absent + 1 if who else 0
        if absent >= 2:
            raise vanished(who)
        if time.monotonic() >= deadline:
            raise timed_out()


class VerifierLink:
    """See the module docstring. ``drafter``: the node's EarlyExitDrafter (None while unloaded);
    ``inboxes``: request id -> queue of final outcomes (a stage pipeline's client shares it)."""

    def __init__(self, node, timeout_s: float) -> None:
        self.node, self.timeout_s = node, timeout_s
        self.drafter = None
        self.inboxes: dict[str, queue.Queue] = {}
        self.heard: set[str] = set()  # live requests the verifier has answered (any outcome)
        self.sent_at: dict[tuple[str, int], float] = {}  # (request, round) -> when its draft went out
        self.round_trips = Window()  # seconds from a round's draft to its final (diagnostics)
        self.last_final_at = 0.0  # time.monotonic() of the last final heard
        self.failed: tuple[float, str] = (0.0, "")  # the last request the verifier failed: when, why
        self.DraftTree = rt.message("edge_llm_ros/msg/DraftTree")
        self.PruneInfo = rt.message("edge_llm_ros/msg/PruneInfo")
        self.draft_pub = rt.shaped(node, node.create_publisher(self.DraftTree, "draft", 100))
        self.draft_gate = MatchGate(node, self.draft_pub)  # a verifier that just (re)started gets the draft
        self.prune_pub = rt.shaped(node, node.create_publisher(self.PruneInfo, "prune", 100))
        self.prune_gid = gid_field(rt.publisher_gid(self.prune_pub))  # what every draft names as its pruner
        node.create_subscription(rt.message("edge_llm_ros/msg/VerifyResult"), "verify", self.on_verify, 100)

    def send(self, draft) -> None:
        """Publish a DraftRequest on `draft` (also the drafter's sender, for drafts sent ahead)."""
        self.draft_gate.wait()
        self.sent_at.setdefault((draft.request_id, draft.round), time.monotonic())  # a resend keeps the first
        msg = to_message(self.DraftTree, draft)
        msg.prune_gid = self.prune_gid
        self.draft_pub.publish(stamp(self.node, msg))

    def on_verify(self, msg) -> None:
        """Early outcomes go to the drafter (pre-drafting), finals (and stages' refusals) to their
        request's inbox."""
        from edge_llm_ros.core.edge_cloud import VerifyOutcome

        outcome = from_message(VerifyOutcome, msg)
        inbox, drafter = self.inboxes.get(outcome.request_id), self.drafter
        if inbox is None:
            return  # another robot's request, or one that ended
        self.heard.add(outcome.request_id)
        if outcome.final:  # a verifier's final outcome, or a stage's refusal (stage pipeline)
            self.last_final_at = time.monotonic()
            sent = self.sent_at.pop((outcome.request_id, outcome.round), None)
            if sent is not None:
                self.round_trips.add(time.monotonic() - sent)
            inbox.put(outcome)
        elif drafter is not None:
            drafter.on_early(outcome)

    def release(self, request_id: str) -> None:
        """Free the request's cache on the verifier."""
        self.prune_pub.publish(stamp(self.node, self.PruneInfo(request_id=request_id, release=True)))

    def rounds(self, request_id: str, prompt_ids, config, *, stats_out: list | None = None, **start):
        """(step, final outcome) per round of one request (core.robot_rounds over this link); the
        request ends with the generator (the drafter forgets it, the verifier is told to release
        it; ``stats_out`` gets its EdgeCloudStats). ``start``: EarlyExitDrafter.start's keywords.
        Raises VerifierTimeout, DraftRejectedError or ValueError."""
        from edge_llm_ros.core.edge_cloud import robot_rounds

        drafter = self.drafter
        if drafter is None:
            raise ValueError("not configured: no drafter loaded")
        inbox: queue.Queue = queue.Queue()
        self.inboxes[request_id] = inbox
        committed, first = [0], []  # first: round 0's draft, resent until anything answers
        resend_at = [0.0, PEER_CHECK_S]  # when next (set as round 0 goes out), and the interval

        def send(draft) -> None:
            if draft.round == 0:
                first.append(draft)
                resend_at[0] = time.monotonic() + PEER_CHECK_S
            self.send(draft)

        def resend() -> None:  # after 1, 3, 7, ... s: a verifier's queue that is only long gets few copies
            if not first or request_id in self.heard or time.monotonic() < resend_at[0]:
                return
            if resend_at[1] == PEER_CHECK_S:
                self.node.get_logger().info(f"request {request_id}: no answer to round 0 within "
                                            f"{PEER_CHECK_S:g} s; resending it until the verifier answers")
            resend_at[1] *= 2
            resend_at[0] = time.monotonic() + resend_at[1]
            self.send(first[0])

        try:
            for step, final in robot_rounds(drafter, request_id, prompt_ids, config, send=send,
                                            await_final=lambda: self.await_final(inbox, committed[0], resend),
                                            **start):
                committed[0] += len(step.tokens)
                yield step, final
        finally:
            self.inboxes.pop(request_id, None)
            self.heard.discard(request_id)
            for key in [key for key in list(self.sent_at) if key[0] == request_id]:
                self.sent_at.pop(key, None)
            stats = drafter.end(request_id)
            if stats_out is not None and stats is not None:
                stats_out.append(stats)
            self.release(request_id)

    def await_final(self, inbox: queue.Queue, tokens: int, idle=None):
        """The next final outcome of a request (:func:`await_answer`, ``idle`` its idle hook):
        VerifierTimeout after timeout_s, or once no verifier subscribes to `draft` (it died: the
        draft in flight is lost with it)."""
        topic = self.node.resolve_topic_name("draft")

        def failed(error):  # remembered for the node's status (the verifier is not answering)
            self.failed = (time.monotonic(), str(error))
            return error

        return await_answer(
            inbox, self.timeout_s, lambda: topic if self.node.count_subscribers("draft") == 0 else "",
            lambda: failed(VerifierTimeout(f"no final VerifyResult within timeout_s={self.timeout_s:g} s (after "
                                           f"{tokens} tokens): is verifier_node running and subscribed to {topic}?")),
            lambda who: failed(VerifierGone(f"verifier gone: nothing subscribes to {who} any more (verifier_node "
                                            f"died or is restarting; {tokens} token(s) committed)")), idle)
