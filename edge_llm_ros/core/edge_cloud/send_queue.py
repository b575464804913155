"""What waits for the server's link: EE Algorithm 2's queue Q_e, finals first, then the most confident.

Knows nothing about ROS.
"""

from __future__ import annotations

import heapq
import itertools
import threading

from .records import VerifyOutcome


class OutcomeSendQueue:
    """EE Algorithm 2's queue Q_e between the verifier (producer) and the link's sender (consumer).

    Interpretation (the paper's Sender pops Q_e by confidence while the Listener keeps verifying):
    when the link is busy, outcomes pile up here and leave in this order:

    * a final outcome first (finals among themselves in arrival order); putting it drops the
      pending early outcomes of its request and round (and older rounds): the robot has no use for
      hypotheses once the final is out (Algorithm 2, line 10: Q_e.reset());
    * then early outcomes, highest confidence S first (ties: arrival order);
    * an early outcome of a round whose final was already put is dropped at once.

    Bookkeeping is per active request: a rejection (``error``) leaves none behind, and the node
    calls :meth:`forget` when a request ends, so refused and finished requests hold no memory.
    Thread-safe; ``get`` blocks (with a timeout) and returns None once closed and drained.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._heap: list[tuple] = []
        self._seq = itertools.count()
        self._finished: dict[str, int] = {}  # request id -> newest round whose final was put
        self._closed = False
        self.dropped = 0

    def __len__(self) -> int:
        with self._cond:
            return len(self._heap)

    def put(self, outcome: VerifyOutcome) -> None:
        with self._cond:
            if self._closed:
                raise RuntimeError("put on a closed OutcomeSendQueue")
            done = self._finished.get(outcome.request_id, -1)
            if outcome.final:
                if not outcome.error:  # a refused draft has no early outcomes to drop later: keep no state
                    self._finished[outcome.request_id] = max(done, outcome.round)
                kept = [e for e in self._heap if not self._obsolete(e[-1], outcome.request_id, outcome.round)]
                self.dropped += len(self._heap) - len(kept)
                self._heap = kept
                heapq.heapify(self._heap)
                heapq.heappush(self._heap, (0, 0.0, next(self._seq), outcome))
            elif outcome.round <= done:
                self.dropped += 1
                return
            else:
                heapq.heappush(self._heap, (1, -outcome.confidence, next(self._seq), outcome))
            self._cond.notify()

    @staticmethod
    def _obsolete(pending: VerifyOutcome, request_id: str, round: int) -> bool:
        return not pending.final and pending.request_id == request_id and pending.round <= round

    def get(self, timeout: float | None = None) -> VerifyOutcome | None:
        """The next outcome to send; None on timeout or once closed and empty."""
        with self._cond:
            if not self._cond.wait_for(lambda: self._heap or self._closed, timeout):
                return None
            return heapq.heappop(self._heap)[-1] if self._heap else None

    def forget(self, request_id: str) -> None:
        """Drop a finished request's bookkeeping and anything of it still pending."""
        with self._cond:
            kept = [e for e in self._heap if e[-1].request_id != request_id]
            self.dropped += len(self._heap) - len(kept)
            self._heap = kept
            heapq.heapify(self._heap)
            self._finished.pop(request_id, None)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()


