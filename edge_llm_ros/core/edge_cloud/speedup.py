"""EE Appendix B: the speedup of fast SD over vanilla SD that the miss rate allows. Knows nothing about ROS."""

from __future__ import annotations


def projected_speedup(gamma: float, c: float, miss_rate: float) -> float:
    """EE Appendix B, Eq. 9 (no communication latency, no thread overhead), speedup over vanilla SD:

        speedup = (γ c + 1) / (r γ c + 1)       c = T_p / T_q (draft / target forward time), r = miss rate

    A hit hides the γ draft passes (γ c target-pass units) behind the verification; a miss pays them.
    """
    if gamma < 1 or c < 0 or not 0.0 <= miss_rate <= 1.0:
        raise ValueError(f"need gamma >= 1, c >= 0 and 0 <= miss_rate <= 1, got {gamma}, {c}, {miss_rate}")
    return (gamma * c + 1) / (miss_rate * gamma * c + 1)
