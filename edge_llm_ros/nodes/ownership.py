"""Requests belong to their sender (issue 30): which publishers may act on a live request.

A verifier or a stage keeps a request's state between messages, and a request is named by its id
alone, which every robot reads on `verify` (VerifyResult is broadcast) round after round. A
process that publishes a PruneInfo with `release` for a live id would end another robot's
request; a DraftTree or HiddenStates for it would corrupt its cache. So a request belongs to the
publishers of the robot that opened it, known by their gid: the middleware's name of the
publisher a message came from (runtime: a subscription callback's message info).

- Its drafts (verifier) or rows (stage) must come from the publisher of the message that opened it:
  the round-0 DraftTree, or the first rows that made the request's cache at a stage (at stage k > 0
  that is stage k-1's output publisher). A fork (PruneInfo `fork_from`) takes its source's owner.
- Its PruneInfos (prunes, release) must come from the publisher that opening message names in
  `prune_gid` (the robot sends it with every message; each stage forwards its own request's).

Why declared and not learned: a robot sends drafts and prunes from two publishers of one node, and
a gid does not say which node it belongs to (rmw_zenoh hashes an endpoint's liveliness token into
it, the embedded backend draws it at random; only DDS shares a participant's prefix), so one cannot
be derived from the other. Learning the prune publisher from a request's first PruneInfo is a race
the forger wins: in edge-cloud the first PruneInfo a request sends is its release, long after its id
is on `verify`. The opening message leaves before anyone else can know the id (it is random, and
nothing answers before it arrives), so what it declares is the robot's.

A refused message is dropped, counted (the node's status: "foreign messages refused") and logged
with runtime.throttle's rule, and never answered: an answer on `verify` carries the request's id,
and the robot it belongs to would end the request on it, which is what a forger wants. Ownership
ends with the request (release, expiry, failure); the id may be opened again afterwards.

What this defends against, and what not: any process publishing through its own middleware
publishers (a ROS 2 node; with or without a keystore) cannot act on a request it did not open. A
gid is no credential: a process that writes the wire itself can put another's in a Zenoh attachment
or an RTPS header (every message on `draft`, `prune` or `stage_<i>/in` shows its sender's to whoever
may read that topic; DDS discovery announces every writer's). Keeping such processes off those
topics is the keystore's part (runtime/security.py: which enclaves may publish there).
"""

from __future__ import annotations

import threading
from array import array
from dataclasses import dataclass
from typing import Any

from edge_llm_ros.runtime.throttle import flood_note


@dataclass(frozen=True)
class Owner:
    sender: bytes  # the gid of the publisher of the request's drafts (verifier) or rows (stage)
    pruner: bytes  # the gid its opening message named in `prune_gid`: the publisher of its PruneInfos


def gid_field(gid: bytes) -> array:
    """A gid as a `uint8[]` field takes it on both runtimes (as nodes/wire.py sends bytes)."""
    return array("B", gid)


class Owners:
    """request id -> :class:`Owner`, while the request lives; ``refused``: the messages refused since
    the node started. ``logger``: the node's; each refusal is a warning, throttled."""

    def __init__(self, logger: Any) -> None:
        self.logger = logger
        self.refused = 0
        self._owners: dict[str, Owner] = {}
        self._lock = threading.Lock()  # callbacks and the worker thread refuse and count

    def __len__(self) -> int:
        return len(self._owners)

    def of(self, request_id: str) -> Owner | None:
        return self._owners.get(request_id)

    def bind(self, request_id: str, owner: Owner) -> None:
        """The request is opened by ``owner``'s publishers (a request already bound keeps its owner)."""
        self._owners.setdefault(request_id, owner)

    def end(self, request_id: str) -> None:
        self._owners.pop(request_id, None)

    def clear(self) -> None:
        self._owners.clear()

    def sends(self, request_id: str, gid: bytes, what: str) -> bool:
        """Whether a draft or rows (``what``) for the request from publisher ``gid`` may act on it:
        the request is not open here, or ``gid`` opened it. Else refused: counted and logged."""
        owner = self._owners.get(request_id)
        return owner is None or self._admits(request_id, gid, owner.sender, what)

    def prunes(self, request_id: str, gid: bytes, what: str) -> bool:
        """Whether a PruneInfo (``what``: prune, release, fork) for the request from publisher ``gid``
        may act on it: the request is not open here, or ``gid`` is the publisher it named."""
        owner = self._owners.get(request_id)
        return owner is None or self._admits(request_id, gid, owner.pruner, what)

    def _admits(self, request_id: str, gid: bytes, expected: bytes, what: str) -> bool:
        if gid == expected:
            return True
        with self._lock:
            self.refused += 1
            note = flood_note(self.refused)
        if note is not None:
            self.logger.warning(f"{what} for request {request_id[:64]!r} from publisher {gid.hex() or '(none)'} "
                                f"refused: not the owner: request {request_id[:64]!r} belongs to another publisher"
                                f"{note}")
        return False
