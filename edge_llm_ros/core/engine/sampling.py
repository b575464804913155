"""Logits -> probabilities -> tokens, with injected randomness.

Contract: :class:`Sampler` turns logits into the distribution a token is
actually drawn from (temperature, then top-k, then top-p, as transformers'
``generate`` warps them) and draws with its own ``torch.Generator``. With
``temperature == 0`` it is greedy. Draft and target each get a sampler; both
apply the same warps so the draft's proposal q resembles the target's p.
Knows nothing about ROS.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


def make_generator(seed: int | None) -> torch.Generator:
    gen = torch.Generator()
    if seed is None:
        gen.seed()
    else:
        gen.manual_seed(int(seed))
    return gen


@dataclass
class Sampler:
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    generator: torch.Generator = field(default_factory=lambda: make_generator(None))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        """Warped distribution [..., V] (float32). Greedy: one-hot at the argmax."""
        logits = logits.float()
        if self.greedy:
            return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
        logits = logits / self.temperature
        if 0 < self.top_k < logits.shape[-1]:
            kth = torch.topk(logits, self.top_k, dim=-1).values[..., -1:]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        if self.top_p < 1.0:
            # Keep the smallest top set whose mass reaches top_p (always at least one token).
            sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
            sorted_probs = sorted_logits.softmax(-1)
            mass_before = sorted_probs.cumsum(-1) - sorted_probs
            drop_sorted = mass_before >= self.top_p
            drop_sorted[..., 0] = False
            drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
            logits = logits.masked_fill(drop, float("-inf"))
        return logits.softmax(-1)

    def draw(self, probs: torch.Tensor) -> int:
        """One token from a distribution [V]."""
        if self.greedy:
            return int(probs.argmax())
        return int(torch.multinomial(probs, 1, generator=self.generator))

    def uniform(self) -> float:
        return float(torch.rand((), generator=self.generator))

    def draw_distinct(self, probs: torch.Tensor, k: int) -> list[int]:
        """k distinct tokens in sequential sampling-without-replacement order.

        Gumbel-top-k: sorting log q + Gumbel noise gives exactly the order of drawing
        from q, removing the drawn token and renormalising, k times. Greedy: top-k.
        """
        k = min(k, int((probs > 0).sum()))
        if self.greedy:
            return torch.topk(probs, k).indices.tolist()
        u = torch.rand(probs.shape, generator=self.generator).clamp_(1e-20, 1.0)
        keys = probs.log() - (-u.log()).log()
        return torch.topk(keys, k).indices.tolist()
