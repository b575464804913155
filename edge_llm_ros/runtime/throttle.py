"""Log lines under a flood: one rule for every place that reports each bad input it drops.

Each drop is answered or counted, but a node that logged every one of 10,000 fuzzed messages
would bury the lines that matter (and fill a robot's disk). :func:`flood_note` says whether the
``count``-th such event is logged, and what to append so the reader knows lines were skipped.
"""

from __future__ import annotations

FIRST = 20  # every one of the first FIRST events is logged ...
EVERY = 100  # ... then every EVERY-th


def flood_note(count: int) -> str | None:
    """None: do not log the ``count``-th event (1-based); else the suffix to log it with."""
    if count > FIRST and count % EVERY:
        return None
    return f" ({count} so far; logging every {EVERY}th)" if count >= FIRST else ""
