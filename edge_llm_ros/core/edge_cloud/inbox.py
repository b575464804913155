"""The server's intake: what waits between the middleware's callbacks and the one verify worker.

Contract: the verifier serves one round at a time, so every draft waits here first. Two lanes keep
one robot's traffic from costing another robot its request:

* the **live** lane holds work for requests already being served (their next rounds, their
  releases, cloud follow-ups); it is bounded generously (a served request has one or two drafts
  in flight), so only a flood of forged drafts for a live id could fill it;
* the **new** lane holds everything else: round 0 of new requests and drafts that name unknown
  requests. It is small; when it is full, :meth:`DraftInbox.put` says so and the caller refuses the
  draft as busy at once (it never waits and never hangs).

:meth:`DraftInbox.get` serves the live lane first, but takes one item of the new lane after every
``fairness`` live items, so a long cloud generation cannot starve a newcomer either.

Knows nothing about ROS.
"""

from __future__ import annotations

import collections
import threading
from typing import Any


class DraftInbox:
    def __init__(self, max_new: int = 64, max_live: int = 256, fairness: int = 4) -> None:
        if max_new < 1 or max_live < 1 or fairness < 1:
            raise ValueError(f"need max_new, max_live, fairness >= 1, got {max_new}, {max_live}, {fairness}")
        self.max_new, self.max_live, self.fairness = max_new, max_live, fairness
        self._live: collections.deque = collections.deque()
        self._new: collections.deque = collections.deque()
        self._cond = threading.Condition()
        self._served_live = 0  # live items served since the last new one
        self._closed = False

    def __len__(self) -> int:
        with self._cond:
            return len(self._live) + len(self._new)

    def put(self, item: Any, live: bool) -> bool:
        """Queue ``item`` in its lane; False when that lane is full (refuse it as busy) or closed."""
        with self._cond:
            lane, limit = (self._live, self.max_live) if live else (self._new, self.max_new)
            if self._closed or len(lane) >= limit:
                return False
            lane.append(item)
            self._cond.notify()
            return True

    def get(self, timeout: float | None = None) -> Any | None:
        """The next item (live first, a new one every ``fairness`` live ones); None on timeout or
        once closed (what is still queued is dropped: the node is stopping)."""
        with self._cond:
            if not self._cond.wait_for(lambda: self._live or self._new or self._closed, timeout) or self._closed:
                return None
            take_new = self._new and (not self._live or self._served_live >= self.fairness)
            if take_new:
                self._served_live = 0
                return self._new.popleft()
            self._served_live += 1
            return self._live.popleft()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._live.clear()
            self._new.clear()
            self._cond.notify_all()
