"""Edge-cloud speculative decoding with early exits (EE: Venkatesha et al. 2025), middleware-free.

Contract: token ids, trees and outcomes in and out; nothing here imports ROS or Zenoh. The two
halves live in different processes and talk only through two plain records that map field for
field onto the wire messages, so a node only copies fields:

    DraftRequest   <->  msg/DraftTree.msg      robot -> server, one per round
    VerifyOutcome  <->  msg/VerifyResult.msg   server -> robot, early outcomes then the final one

Server (EE Algorithm 2): :class:`EarlyExitVerifier` runs the target's layers over the tree rows
and, at every exit on the way up, verifies the tree greedily with that exit's logits and yields
the outcome at once (a node sends it while the remaining layers run). Only the last layer's
outcome commits. :class:`OutcomeSendQueue` orders the outcomes waiting for the link.

Robot (EE Algorithm 1): :class:`EarlyExitDrafter` keeps each request's context and round. Every
early outcome of round r hypothesises round r's result; the next draft is pre-drafted from the
hypothesised context on worker threads, most confident first (:class:`PreDraftCache`). When the
final outcome arrives, a pre-draft made from exactly the final context is served at once (hit);
otherwise the next draft is made now (miss).

:func:`stream_edge_cloud` / :func:`run_edge_cloud` run both halves in one process with a pluggable
link, for tests and the bench; :func:`linked_rounds` puts the server on its own thread behind
emulated links both ways. Every emitted token is verified at the final layer, so the output
is the target's: greedy token for token, sampled distributed as the target's.

Modules: ``records`` (the wire records and their checks), ``server`` (the verifier),
``inbox`` (its intake, live requests first), ``send_queue`` (its outgoing queue), ``predraft`` (the robot's pre-draft cache), ``robot`` (the
drafter side), ``local`` (both halves in one process), ``sim`` (both halves with simulated time),
``speedup`` (EE Appendix B).
"""

from .inbox import DraftInbox
from .local import (
    Deliver,
    EdgeCloudResult,
    Link,
    Shaper,
    direct_link,
    edge_cloud_rounds,
    linked_rounds,
    run_edge_cloud,
    stream_edge_cloud,
)
from .predraft import CacheKey, PreDraft, PreDraftCache
from .records import (
    MAX_REQUEST_ID,
    MAX_TOPK,
    PROPOSAL_TOP_K,
    ROW_SUM_TOLERANCE,
    DraftError,
    DraftRejectedError,
    DraftRequest,
    RequestLimitError,
    SpeculationMissed,
    VerifyOutcome,
)
from .robot import EDGE_MODES, EarlyExitDrafter, EdgeCloudStats, FinalStep, robot_rounds
from .send_queue import OutcomeSendQueue
from .server import EarlyExitVerifier, VerifierStats, VerifierTask
from .speedup import projected_speedup

__all__ = [
    "CacheKey", "Deliver", "DraftInbox", "DraftError", "DraftRejectedError", "DraftRequest", "EDGE_MODES", "EarlyExitDrafter",
    "EarlyExitVerifier", "EdgeCloudResult", "EdgeCloudStats", "FinalStep", "Link", "Shaper", "MAX_REQUEST_ID", "MAX_TOPK", "PROPOSAL_TOP_K", "OutcomeSendQueue",
    "PreDraft", "PreDraftCache", "ROW_SUM_TOLERANCE", "RequestLimitError", "SpeculationMissed", "VerifierStats",
    "VerifierTask", "VerifyOutcome", "direct_link", "edge_cloud_rounds", "linked_rounds", "projected_speedup", "robot_rounds", "run_edge_cloud", "stream_edge_cloud",
]
