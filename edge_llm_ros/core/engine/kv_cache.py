"""Preallocated key/value cache for one contiguous range of decoder layers.

Contract: a cache stores keys and values per layer as slots ``[0, length)``.
A forward pass writes its new rows with :meth:`KVCache.write` at slots
``[length, length + T)`` for every layer of the range, then calls
:meth:`KVCache.commit` once; nothing becomes visible to later passes before
that. After tree verification the accepted path is compacted with
:meth:`KVCache.keep`; a rollback is :meth:`KVCache.truncate`.

Slots are storage order, not positions: after ``keep`` the slots are dense
while the rotary positions baked into the keys are whatever they were when
written (prefix_len + depth for tree nodes), which is what the model needs.
:class:`Cache` is what the engine asks of any model's cache (the llama.cpp backend's
:class:`~.llama_backend.LlamaCache` is one too). Knows nothing about ROS.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch


class Cache(Protocol):
    """What the decoding engine and the drafters do with a model's cache: slots ``[0, length)``
    (structural: :class:`KVCache` and LlamaCache match it without naming it)."""

    @property
    def length(self) -> int: ...

    @property
    def capacity(self) -> int: ...

    def ensure_capacity(self, needed: int) -> None: ...

    def keep(self, indices: Sequence[int] | torch.Tensor) -> None: ...

    def truncate(self, length: int) -> None: ...


class KVCache:
    """Keys and values of ``num_layers`` layers, ``[L, B, H, S_max, D]`` each."""

    def __init__(
        self,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        capacity: int,
        *,
        batch: int = 1,
        first_layer: int = 0,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ) -> None:
        if num_layers <= 0 or capacity <= 0:
            raise ValueError(f"KVCache needs num_layers > 0 and capacity > 0, got {num_layers}, {capacity}")
        self.first_layer = first_layer
        self.num_layers = num_layers
        self.length = 0
        shape = (num_layers, batch, num_kv_heads, capacity, head_dim)  # [L, B, H, S_max, D]
        with torch.inference_mode():
            self.k = torch.empty(shape, dtype=dtype, device=device)
            self.v = torch.empty(shape, dtype=dtype, device=device)

    @property
    def capacity(self) -> int:
        return self.k.shape[3]

    @property
    def layers(self) -> range:
        """The model layers this cache holds (absolute indices)."""
        return range(self.first_layer, self.first_layer + self.num_layers)

    @torch.inference_mode()
    def ensure_capacity(self, needed: int) -> None:
        """Grow (by doubling, keeping the contents) until ``needed`` slots fit."""
        if needed <= self.capacity:
            return
        new_cap = max(needed, 2 * self.capacity)
        shape = (*self.k.shape[:3], new_cap, self.k.shape[4])
        k = torch.empty(shape, dtype=self.k.dtype, device=self.k.device)
        v = torch.empty(shape, dtype=self.v.dtype, device=self.v.device)
        k[:, :, :, : self.length] = self.k[:, :, :, : self.length]
        v[:, :, :, : self.length] = self.v[:, :, :, : self.length]
        self.k, self.v = k, v

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store ``k, v`` ([B, H, T, D]) of absolute ``layer`` after the committed slots.

        Returns the keys and values visible to this pass, ``[B, H, length + T, D]``.
        Call inside ``torch.inference_mode()`` (the model's forward is).
        """
        i = layer - self.first_layer
        end = self.length + k.shape[2]
        if end > self.capacity:
            raise ValueError(f"KV cache overflow: {end} slots needed, capacity {self.capacity}")
        self.k[i, :, :, self.length : end] = k
        self.v[i, :, :, self.length : end] = v
        return self.k[i, :, :, :end], self.v[i, :, :, :end]

    def commit(self, num_new: int) -> None:
        """Make the rows written by the last pass part of the cache."""
        self.length += num_new

    def truncate(self, length: int) -> None:
        """Forget every slot from ``length`` on (rollback)."""
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot truncate a cache of length {self.length} to {length}")
        self.length = length

    @torch.inference_mode()
    def keep(self, indices: Sequence[int] | torch.Tensor) -> None:
        """Keep only the slots ``indices`` (strictly increasing), compacted to ``[0, len(indices))``.

        Used after tree verification: keep the prefix and the accepted path.
        """
        idx = torch.as_tensor(indices, dtype=torch.long, device=self.k.device).flatten()
        n = idx.numel()
        if n and (int(idx[-1]) >= self.length or int(idx[0]) < 0 or bool((idx[1:] <= idx[:-1]).any())):
            raise ValueError(f"keep indices must be strictly increasing slots below {self.length}")
        # Slots already in place (idx[i] == i) need no copy; move only the tail.
        moved = (idx != torch.arange(n, device=idx.device)).nonzero()
        if moved.numel():
            start = int(moved[0])
            src = idx[start:]
            self.k[:, :, :, start:n] = self.k[:, :, :, src]  # gather copies before writing
            self.v[:, :, :, start:n] = self.v[:, :, :, src]
        self.length = n
