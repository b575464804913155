"""Timing a step the way every measurement here does: the median of repeated runs after a warm-up.

Knows nothing about ROS.
"""

from __future__ import annotations

import time
from collections.abc import Callable


def median_ms(step: Callable[[int], object], repeats: int, after: Callable[[], object] = lambda: None,
              warmup: bool = True) -> float:
    """Median ms of ``step(r)`` over ``repeats`` runs, after one untimed warm-up run if ``warmup``;
    ``after()`` runs untimed after each (resetting a cache)."""
    times = []
    for r in range(repeats + warmup):
        start = time.perf_counter()
        step(r)
        times.append(time.perf_counter() - start)
        after()
    timed = sorted(times[warmup:])
    return 1000 * timed[len(timed) // 2]
