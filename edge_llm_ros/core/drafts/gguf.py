"""A trained draft as a GGUF file, so llama.cpp runs it: the CPU drafter.

Contract: :func:`export_draft_gguf` writes a draft directory (see :mod:`.draft_models`: K
decoder layers + final norm, fp16, Hugging Face layout) as a GGUF of architecture ``llama``
with ``block_count`` K, completed by what the draft shares with its target GGUF: the token
embedding (its bytes copied as they are, same quantization, tied as the output head) and the
``tokenizer.*`` keys, whole or restricted to the draft's vocabulary subset (below).
:func:`default_draft_gguf` exports the shipped draft once into the model cache;
:func:`load_llama_drafter` runs a draft GGUF on llama.cpp as a :class:`~.drafters.ModelDrafter`,
refusing one whose vocabulary differs from the target's. Knows nothing about ROS.

The draft's head was trained on a vocabulary subset ("vocab_ids"): scored over the whole
vocabulary, a third of its argmaxes fall outside the subset (measured on README text with the
torch draft's own full head), so the drafter sets the logits outside it to -inf: the torch
draft's distribution, computed by llama.cpp. The GGUF keeps the subset as metadata
(``edge_llm_ros.draft.vocab_ids``, comma-separated ids: llama.cpp's metadata API returns scalar
values only). Two layouts (:data:`VOCABS`):

- ``subset`` (the default): the GGUF's vocabulary IS the subset, in subset order (token k is id
  ``vocab_ids[k]``; tokens, types, the merges among them, the special ids it holds), and its
  token embedding the subset's rows, so llama.cpp's tied head scores K rows, not V. Inputs can be
  any target id, so the drafter feeds llama.cpp embeddings instead of ids
  (:class:`TokenEmbedding`: the target GGUF's token embedding, memory-mapped, dequantized as
  llama.cpp's get_rows does; the file keeps where it is, ``edge_llm_ros.draft.input_embedding``,
  and refuses to load if its bytes changed). Logits equal the ``full`` layout's bit for bit (400
  positions of README text, one batch; greedy chains identical).
- ``full``: the target's whole vocabulary and token embedding (the first export; self-contained).

Layer weights: Q8_0 by default. Measured on the 2-core dev machine (shared, load 3-5), chains of
4 through ``ModelDrafter.propose``, ms per drafted token (medians, drafters interleaved), at 2 / 1
threads: torch draft 11.4 / 15.7, Q8_0 5.0 / 9.4 (2.3x / 1.7x cheaper), f16 5.5 / 10.4. τ of ``sd``
(γ = 4, 6 prompts x 96 tokens): 1.577 with either, 1.581 with the torch draft. Logits against the
torch draft, 400 positions: mean |Δ| 0.043 (Q8_0), 0.027 (f16); argmax agreement 97% / 98%. The
full-vocabulary Q8_0 head was about half of a llama.cpp step (2.8 of 5.2 ms at 1 thread); a Q4_0
head would halve it, but its argmax agreed with the torch draft's on 82% of positions only; the
subset head scores 8192 of 49152 rows instead. Same machine, quieter (load ~1), Q8_0, two runs,
2 / 1 threads: torch 8.2-8.8 / 8.2-8.9, full 3.1-3.6 / 4.6-5.4, subset 2.0-2.3 / 2.7-3.0 ms
(3.9-4.2x / 2.9-3.1x cheaper than torch; at 1 thread 2.0 of the 3.0 ms are llama_decode, the
rest the drafter's sampling over V); τ of ``sd`` (γ = 4, 3 prompts x 64 tokens) 1.477 with
either layout, 1.488 with the torch draft. Lower-bit layers (:data:`LAYER_TYPES`), subset layout,
1 thread, idle: torch 8.1, Q8_0 2.8, Q5_1 2.8, Q4_1 2.6 ms per drafted token; τ 1.56 / 1.54 /
1.56 / 1.61 (3 prompts x 64 tokens, all lossless): Q4_1 saves 8%, within the noise of τ, so
Q8_0 stays the default.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import logging
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from ..engine.drafters import ModelDrafter
from ..engine.llama_backend import LlamaCache, LlamaCppLM
from ..engine.models import (
    CausalLM,
    _model_path,
    _write_cache_entry,
    gguf_cache_entry,
    tokenizer_fingerprint,
    vocab_fingerprint,
)
from .draft_models import (
    CONFIG_FILE,
    WEIGHTS_FILE,
    DraftMismatchError,
    default_draft_path,
    read_config,
    read_weights,
)

_log = logging.getLogger(__name__)

LAYER_TYPES = ("q8_0", "q5_1", "q4_1", "f16")
DEFAULT_LAYER_TYPE = "q8_0"
VOCABS = ("subset", "full")  # the GGUF's vocabulary: the draft's subset (its head scores it only), or the target's
DEFAULT_VOCAB = "subset"
VOCAB_IDS_KEY = "edge_llm_ros.draft.vocab_ids"
SOURCE_KEY = "edge_llm_ros.draft.source"
INPUT_EMBEDDING_KEY = "edge_llm_ros.draft.input_embedding"
EXPORT_FILE = "draft.gguf"
EXPORT_VERSION = 1  # part of the cache key: bump when the same inputs give another file

# A decoder layer's parameters: Hugging Face name -> llama.cpp name (blk.N.<name>).
LAYER_TENSORS = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}


# -- the draft's tensors in llama.cpp's layout ----------------------------------------------------


def permute_rotary(weight: np.ndarray, n_head: int) -> np.ndarray:
    """A q or k projection [H*D, E] from Hugging Face's rotary layout to llama.cpp's.

    HF rotates the halves of each head (pairs i, i + D/2), llama.cpp adjacent elements (pairs
    2i, 2i + 1); convert_hf_to_gguf.py's ``LlamaModel.permute`` interleaves each head's halves,
    and transformers undoes it when it loads a GGUF (where the draft's weights came from).
    """
    halves = weight.reshape(n_head, 2, weight.shape[0] // n_head // 2, *weight.shape[1:])  # [H, 2, D/2, E]
    return halves.swapaxes(1, 2).reshape(weight.shape)  # [H, D/2, 2, E] -> [H*D, E]


def encode_matrix(weight: np.ndarray, layer_type: str):
    """A weight matrix (fp32) as stored: fp16, or quantized blocks (uint8); and its GGML type."""
    from gguf import GGMLQuantizationType
    from gguf.quants import quantize

    if layer_type == "f16":
        return weight.astype(np.float16), GGMLQuantizationType.F16
    kind = GGMLQuantizationType[layer_type.upper()]
    return quantize(weight, kind), kind


def layer_tensors(state: dict[str, torch.Tensor], config: dict, layer_type: str):
    """(GGUF name, array, GGML type) of the draft's decoder layers and final norm, llama.cpp layout."""
    from gguf import GGMLQuantizationType

    model = config["model_config"]
    heads = {"attn_q.weight": model["num_attention_heads"], "attn_k.weight": model["num_key_value_heads"]}
    for k in range(config["num_layers"]):
        for hf_name, name in LAYER_TENSORS.items():
            weight = state[f"layers.{k}.{hf_name}"].to(torch.float32).numpy()
            if name in heads:
                weight = permute_rotary(weight, heads[name])
            if weight.ndim == 1:  # norms stay fp32, as llama.cpp's converter writes them
                yield f"blk.{k}.{name}", weight, GGMLQuantizationType.F32
            else:
                yield f"blk.{k}.{name}", *encode_matrix(weight, layer_type)
    yield "output_norm.weight", state["norm.weight"].to(torch.float32).numpy(), GGMLQuantizationType.F32


# -- the GGUF file --------------------------------------------------------------------------------


def token_table_fingerprint(tokens: list[str]) -> str:
    """:func:`~..engine.models.vocab_fingerprint` of ``tokens`` (id = index): equal to
    :func:`~..engine.models.tokenizer_fingerprint` of a tokenizer with that vocabulary."""
    return vocab_fingerprint({tok: i for i, tok in enumerate(tokens)})


def check_draft_fits(config: dict, reader, target: Path, draft_dir: Path) -> None:
    """Refuse a target GGUF other than the one the draft was trained for, naming what differs."""
    arch = reader.fields["general.architecture"].contents()
    width = reader.fields.get(f"{arch}.embedding_length")
    tokens = reader.fields["tokenizer.ggml.tokens"].contents()
    theirs = {"architecture": arch, "vocabulary size": len(tokens),
              "embedding length": None if width is None else width.contents()}
    ours = {"architecture": "llama", "vocabulary size": config["target"]["vocab_size"],
            "embedding length": config["model_config"]["hidden_size"]}
    problems = [f"{what}: draft {ours[what]}, target {theirs[what]}" for what in ours if ours[what] != theirs[what]]
    if not problems and token_table_fingerprint(tokens) != config["target"].get("tokenizer_sha256"):
        problems.append("tokenizer: the target's token->id table differs from the one the draft was trained with")
    if problems:
        raise DraftMismatchError(f"draft {draft_dir} does not fit target {target}: " + "; ".join(problems))


def _field_value(field) -> tuple:
    """A GGUFReader field as GGUFWriter.add_key_value takes it: value, type, array element type."""
    from gguf import GGUFValueType

    kind = field.types[0]
    sub = field.types[-1] if kind == GGUFValueType.ARRAY else None
    value = field.contents()
    return (list(value) if sub not in (None, GGUFValueType.STRING) else value), kind, sub


@dataclass
class DraftExport:
    """A draft ready to be written: its config, its tensors (GGUF name, array, GGML type) in
    llama.cpp's layout, its vocabulary subset, and the target GGUF it completes."""

    config: dict
    tensors: list[tuple]
    vocab_ids: torch.Tensor | None
    reader: Any  # gguf.GGUFReader of the target
    source: str
    target: Path
    vocab: str = "full"


def prepare_export(
    draft_dir: str | os.PathLike | None,
    target_gguf: str | os.PathLike | None,
    layer_type: str = DEFAULT_LAYER_TYPE,
    vocab: str = DEFAULT_VOCAB,
) -> DraftExport:
    """Read draft ``draft_dir`` (None: the shipped one) and target ``target_gguf`` (None: SmolLM2's),
    refuse a pair that does not fit, and convert the draft's tensors (layers as ``layer_type``);
    ``vocab``: one of :data:`VOCABS` ("full" for a draft without a subset)."""
    from gguf import GGUFReader

    if layer_type not in LAYER_TYPES:
        raise ValueError(f"unknown layer type {layer_type!r}; expected one of {', '.join(LAYER_TYPES)}")
    if vocab not in VOCABS:
        raise ValueError(f"unknown vocabulary {vocab!r}; expected one of {', '.join(VOCABS)}")
    folder = default_draft_path() if draft_dir is None else Path(draft_dir)
    config = read_config(folder)
    if config.get("kind", "draft") != "draft":
        raise ValueError(f"{folder} holds a {config.get('kind')!r} drafter, which drafts from the target's "
                               "features: only a draft model runs alone on llama.cpp")
    target = _model_path(target_gguf)
    if target.suffix != ".gguf":
        raise ValueError(f"the target must be a .gguf file (its embedding and tokenizer are copied): {target}")
    reader = GGUFReader(target)
    check_draft_fits(config, reader, target, folder)
    expected = {f"layers.{k}.{name}" for k in range(config["num_layers"]) for name in LAYER_TENSORS} | {"norm.weight"}
    state, vocab_ids = read_weights(folder, expected, config["target"]["vocab_size"])
    tensors = list(layer_tensors(state, config, layer_type))
    vocab = "full" if vocab_ids is None else vocab
    return DraftExport(config, tensors, vocab_ids, reader, f"{folder.name} for {target.name}", target, vocab)


def subset_tokenizer(reader, vocab_ids: list[int]):
    """The target's ``tokenizer.*`` keys restricted to ``vocab_ids`` (new id = index in it): tokens,
    types and scores of the subset, the merges among its tokens, the special ids it holds. Only
    for llama.cpp to load the file: the target's tokenizer is the one used."""
    new_id = {old: new for new, old in enumerate(vocab_ids)}
    tokens = reader.fields["tokenizer.ggml.tokens"].contents()
    kept = {tokens[i] for i in vocab_ids}
    for key, field in reader.fields.items():
        if not key.startswith("tokenizer."):
            continue
        value, kind, sub = _field_value(field)
        if key in ("tokenizer.ggml.tokens", "tokenizer.ggml.token_type", "tokenizer.ggml.scores"):
            value = [value[i] for i in vocab_ids]
        elif key == "tokenizer.ggml.merges":
            value = [m for m in value if m.replace(" ", "", 1) in kept and all(p in kept for p in m.split(" ", 1))]
        elif key.endswith("_token_id"):
            if value not in new_id:
                continue
            value = new_id[value]
        yield key, value, kind, sub


def input_embedding_source(export: DraftExport, embedding) -> str:
    """Where a subset draft finds the input embedding of every target id: the target GGUF's token
    embedding (file, byte offset, GGML type, shape, sha256 of its bytes), as JSON."""
    rows = np.asarray(embedding.data)
    return json.dumps({"file": str(export.target.resolve()), "offset": int(embedding.data_offset),
                       "type": int(embedding.tensor_type), "shape": list(rows.shape),
                       "sha256": hashlib.sha256(rows.tobytes()).hexdigest()})


def write_gguf(export: DraftExport, path: Path) -> None:
    """The llama metadata from the draft's config, the target's tokenizer keys, the target's token
    embedding bytes (the tied output head too) and the draft's tensors."""
    from gguf import GGUFWriter, LlamaFileType

    config, model = export.config, export.config["model_config"]
    rope_theta = (model.get("rope_parameters") or {}).get("rope_theta", model.get("rope_theta", 10000.0))
    writer = GGUFWriter(path, "llama")
    writer.add_type("model")
    writer.add_name(f"{config.get('name', 'draft')} (edge_llm_ros draft, {config['num_layers']} layers)")
    writer.add_string(SOURCE_KEY, export.source)
    writer.add_context_length(model["max_position_embeddings"])
    writer.add_embedding_length(model["hidden_size"])
    writer.add_feed_forward_length(model["intermediate_size"])
    writer.add_block_count(config["num_layers"])
    writer.add_head_count(model["num_attention_heads"])
    writer.add_head_count_kv(model["num_key_value_heads"])
    writer.add_rope_freq_base(float(rope_theta))
    writer.add_rope_dimension_count(model.get("head_dim") or model["hidden_size"] // model["num_attention_heads"])
    writer.add_layer_norm_rms_eps(float(model["rms_norm_eps"]))
    subset = export.vocab == "subset"
    ids = [int(i) for i in export.vocab_ids] if subset else None
    writer.add_vocab_size(len(ids) if subset else config["target"]["vocab_size"])
    quantized = any(kind.name == "Q8_0" for _, _, kind in export.tensors)
    writer.add_file_type(LlamaFileType.MOSTLY_Q8_0 if quantized else LlamaFileType.MOSTLY_F16)
    if export.vocab_ids is not None:
        writer.add_string(VOCAB_IDS_KEY, ",".join(str(int(i)) for i in export.vocab_ids))
    embedding = next(t for t in export.reader.tensors if t.name == "token_embd.weight")
    if subset:  # the subset's rows: the tied head scores them only; inputs come as embeddings
        writer.add_string(INPUT_EMBEDDING_KEY, input_embedding_source(export, embedding))
        for key, value, kind, sub in subset_tokenizer(export.reader, ids):
            writer.add_key_value(key, value, kind, sub)
        writer.add_tensor("token_embd.weight", np.asarray(embedding.data)[ids], raw_dtype=embedding.tensor_type)
    else:
        for key, field in export.reader.fields.items():
            if key.startswith("tokenizer."):
                writer.add_key_value(key, *_field_value(field))
        writer.add_tensor("token_embd.weight", np.asarray(embedding.data), raw_dtype=embedding.tensor_type)
    for name, array, kind in export.tensors:
        writer.add_tensor(name, array, raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def write_atomically(export: DraftExport, out_path: str | os.PathLike) -> Path:
    """Write ``export`` to a temporary sibling of ``out_path``, then rename it into place."""
    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}-", dir=out.parent)
    os.close(fd)
    try:
        write_gguf(export, Path(tmp))
        os.chmod(tmp, 0o644)
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return out


def export_draft_gguf(
    draft_dir: str | os.PathLike | None,
    target_gguf: str | os.PathLike | None,
    out_path: str | os.PathLike,
    layer_type: str = DEFAULT_LAYER_TYPE,
    vocab: str = DEFAULT_VOCAB,
) -> Path:
    """Write draft ``draft_dir`` (None: the shipped one) with the token embedding and tokenizer of
    ``target_gguf`` (None: SmolLM2's) as a llama GGUF at ``out_path``, atomically. ``layer_type``:
    one of :data:`LAYER_TYPES`, ``vocab``: one of :data:`VOCABS`. Returns the path."""
    return write_atomically(prepare_export(draft_dir, target_gguf, layer_type, vocab), out_path)


# -- the shipped draft, exported once ------------------------------------------------------------


def draft_fingerprint(draft_dir: Path) -> str:
    """sha256 of what an export is made of: the draft's config and weights, the export version."""
    digest = hashlib.sha256(f"edge_llm_ros draft export {EXPORT_VERSION}\n".encode())
    for name in (CONFIG_FILE, WEIGHTS_FILE):
        with open(draft_dir / name, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()


# With the model cache off: this process's exports, in a folder removed when the process exits.
_uncached: dict[tuple[str, str], Path] = {}
_uncached_dir: tempfile.TemporaryDirectory | None = None


def default_draft_gguf(
    target_gguf: str | os.PathLike | None = None,
    draft_dir: str | os.PathLike | None = None,
    layer_type: str = DEFAULT_LAYER_TYPE,
    vocab: str = DEFAULT_VOCAB,
) -> Path:
    """The draft (None: the shipped one) exported for ``target_gguf`` (None: SmolLM2's): built on
    first use into the model cache (:func:`~.models.model_cache_root`; the entry is keyed on the
    target file's identity and the draft files' content), reused afterwards. With the cache off
    or unwritable, exported once per process into a temporary folder removed at exit."""
    global _uncached_dir

    target = _model_path(target_gguf)
    folder = default_draft_path() if draft_dir is None else Path(draft_dir)
    if not folder.is_dir():
        raise FileNotFoundError(f"draft directory not found: {folder}")
    part = f"draft-{folder.name}-{draft_fingerprint(folder)[:16]}-{layer_type}-{vocab}"
    entry = gguf_cache_entry(target, part)  # its key covers the transformers version too: an upgrade re-exports
    if entry is not None and (entry / EXPORT_FILE).is_file():
        return entry / EXPORT_FILE
    key = (str(target.resolve()), part)
    if key in _uncached and _uncached[key].is_file():
        return _uncached[key]
    _log.info("exporting draft %s for %s to GGUF (once; a few seconds)", folder.name, target.name)
    export = prepare_export(folder, target, layer_type, vocab)
    if entry is not None:
        _write_cache_entry(entry, lambda tmp: write_gguf(export, tmp / EXPORT_FILE))
        if (entry / EXPORT_FILE).is_file():
            return entry / EXPORT_FILE
    if _uncached_dir is None:
        _uncached_dir = tempfile.TemporaryDirectory(prefix="edge_llm_ros-drafts-")
    _uncached[key] = write_atomically(export, Path(_uncached_dir.name) / f"{part}.gguf")
    return _uncached[key]


# -- the drafter on llama.cpp --------------------------------------------------------------------


def llama_tokens(lm) -> list[str]:
    """The token texts of a model loaded in llama.cpp (a LlamaCppLM), in id order."""
    lc = lm._lc
    vocab = lc.llama_model_get_vocab(lm._model)
    return [lc.llama_vocab_get_text(vocab, i).decode("utf-8") for i in range(lm.vocab_size)]


def llama_meta(lm, key: str) -> str | None:
    """A metadata value of a model loaded in llama.cpp, as text (None: absent)."""
    lc = lm._lc
    size = lc.llama_model_meta_val_str(lm._model, key.encode(), None, 0)
    if size < 0:
        return None
    buf = ctypes.create_string_buffer(size + 1)
    lc.llama_model_meta_val_str(lm._model, key.encode(), buf, size + 1)
    return buf.value.decode()


def llama_vocab_ids(lm) -> torch.Tensor | None:
    """The vocabulary subset stored in a draft GGUF loaded in llama.cpp (None: the whole vocabulary)."""
    ids = llama_meta(lm, VOCAB_IDS_KEY)
    return None if ids is None else torch.tensor([int(i) for i in ids.split(",")], dtype=torch.long)


_SCALAR_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}  # GGUF value type -> bytes
_STRING, _ARRAY = 8, 9


def read_gguf_string(path: Path, key: str) -> str | None:
    """The string value of metadata ``key`` in GGUF ``path`` (None: absent), read before llama.cpp
    loads the file (gguf's GGUFReader parses every token and merge: seconds)."""
    import mmap
    import struct

    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        if buf[:4] != b"GGUF":
            return None
        (n_kv,) = struct.unpack_from("<Q", buf, 16)
        at = 24

        def string() -> str:
            nonlocal at
            (n,) = struct.unpack_from("<Q", buf, at)
            at += 8 + n
            return buf[at - n : at].decode("utf-8", errors="replace")

        def skip(kind: int, count: int = 1) -> None:
            nonlocal at
            if kind == _STRING:
                for _ in range(count):
                    string()
            elif kind == _ARRAY:
                for _ in range(count):
                    sub, n = struct.unpack_from("<IQ", buf, at)
                    at += 12
                    skip(sub, n)
            else:
                at += _SCALAR_SIZES[kind] * count

        for _ in range(n_kv):
            name = string()
            (kind,) = struct.unpack_from("<I", buf, at)
            at += 4
            if name == key and kind == _STRING:
                return string()
            skip(kind)
    return None


class TokenEmbedding:
    """The input embedding of any target id, read from the target GGUF's token embedding (memory-
    mapped, as stored) and dequantized as llama.cpp's get_rows does (Q8_0: f16 scale x int8), so
    feeding these rows gives llama.cpp's logits for the ids bit for bit."""

    def __init__(self, source: str, where: str) -> None:
        from gguf import GGMLQuantizationType

        spec = json.loads(source)
        self.file, self.type = Path(spec["file"]), GGMLQuantizationType(spec["type"])
        if not self.file.is_file():
            raise FileNotFoundError(f"draft {where} takes its input embedding from {self.file}, which is missing")
        self.rows = np.memmap(self.file, np.uint8, "r", offset=spec["offset"], shape=tuple(spec["shape"]))
        if hashlib.sha256(self.rows.tobytes()).hexdigest() != spec["sha256"]:
            raise DraftMismatchError(
                f"draft {where}: the token embedding in {self.file} is not the one it was exported with")

    @property
    def vocab_size(self) -> int:
        return self.rows.shape[0]

    def __call__(self, ids: list[int]) -> np.ndarray:
        from gguf.quants import dequantize

        return dequantize(np.asarray(self.rows[ids]), self.type)  # [T, n_embd] fp32


class SubsetVocabLM(CausalLM["LlamaCache"]):
    """A causal LM (llama.cpp's) whose logits are -inf outside ``vocab_ids``: the draft
    distribution of a head that scores only those ids, as the torch draft's does. The model scores
    either the subset only (a subset GGUF: row k is id ``vocab_ids[k]``) or the whole vocabulary.
    Window, tokenizer, file, threads, caches and capabilities are the wrapped model's."""

    def __init__(self, lm: LlamaCppLM, vocab_ids: torch.Tensor, vocab_size: int) -> None:
        self.lm = lm
        self.vocab_ids = vocab_ids
        self.vocab_size = vocab_size
        self.scores_subset = lm.vocab_size == len(vocab_ids)
        self.max_context, self.tokenizer, self.path = lm.max_context, lm.tokenizer, lm.path
        self.provides_features, self.exposes_layers, self.live_caches = (
            lm.provides_features, lm.exposes_layers, lm.live_caches)

    @property
    def n_threads(self) -> int:
        return self.lm.n_threads

    def new_cache(self, capacity: int) -> LlamaCache:
        return self.lm.new_cache(capacity)

    def close(self) -> None:
        self.lm.close()

    def forward(self, token_ids, position_ids, mask, cache, logits_rows=slice(None)):
        logits = self.lm.forward(token_ids, position_ids, mask, cache, logits_rows)  # [T', V'] (V' = K or V)
        if logits is None:
            return None
        scores = logits if self.scores_subset else logits[:, self.vocab_ids]  # [T', K]
        full = torch.full((len(scores), self.vocab_size), float("-inf"))  # [T', V]
        full[:, self.vocab_ids] = scores
        return full

    __call__ = forward


class DraftTarget(Protocol):
    """What a llama.cpp draft is checked against: its target's vocabulary, tokenizer and model file
    (None: not one file), as every CausalLM and core/drafts/loading.TargetVocabulary declare them."""

    vocab_size: int
    tokenizer: Any
    path: Path | None


def check_vocabulary(
    lm: LlamaCppLM, target: DraftTarget, path: Path, vocab_ids: torch.Tensor | None = None, vocab_size: int | None = None
) -> None:
    """Refuse a draft (a LlamaCppLM) whose vocabulary size or tokenizer differs from ``target``'s;
    a subset GGUF (``vocab_ids``, over a vocabulary of ``vocab_size``) is compared on the subset."""
    name = target.path or type(target).__name__
    size = lm.vocab_size if vocab_size is None else vocab_size
    if size != target.vocab_size:
        raise DraftMismatchError(f"draft {path} has a vocabulary of {size} tokens, the target ({name}) "
                               f"one of {target.vocab_size}")
    if target.tokenizer is None:
        return
    if vocab_ids is None:
        same = token_table_fingerprint(llama_tokens(lm)) == tokenizer_fingerprint(target.tokenizer)
    else:
        theirs = {i: tok for tok, i in target.tokenizer.get_vocab().items()}
        same = llama_tokens(lm) == [theirs.get(int(i)) for i in vocab_ids]
    if not same:
        raise DraftMismatchError(f"draft {path} and the target ({name}) have different tokenizers: their token->id "
                               "tables differ")


def load_llama_drafter(
    target: DraftTarget, path: str | os.PathLike | None = None, vocab: str = DEFAULT_VOCAB, **llama_kwargs
) -> ModelDrafter:
    """A :class:`ModelDrafter` over draft GGUF ``path`` on llama.cpp (None: :func:`default_draft_gguf`
    for the target's GGUF if it runs on llama.cpp, else for SmolLM2's; ``vocab``: its layout, one of
    :data:`VOCABS`), for ``target`` (any CausalLM, or a TargetVocabulary); a subset GGUF is fed the target GGUF's embeddings;
    ``llama_kwargs``: :class:`~.llama_backend.LlamaCppLM`'s (the tokenizer defaults to the target's).

    Raises :class:`~.draft_models.DraftMismatchError` (a ValueError naming both) if the draft's vocabulary size or
    tokenizer differs from the target's, before any generation.
    """
    from ..engine.llama_backend import load_llama_cpp

    if path is None:
        target_gguf = target.path  # a llama.cpp target's own GGUF (None: a torch target)
        path = default_draft_gguf(target_gguf if str(target_gguf).endswith(".gguf") else None, vocab=vocab)
    file = Path(path)
    llama_kwargs.setdefault("tokenizer", target.tokenizer)
    source = read_gguf_string(file, INPUT_EMBEDDING_KEY)
    embed = None if source is None else TokenEmbedding(source, str(file))
    lm = load_llama_cpp(file, embed=embed, **llama_kwargs)
    try:
        vocab_ids = llama_vocab_ids(lm)
        size = lm.vocab_size if embed is None else embed.vocab_size
        check_vocabulary(lm, target, file, vocab_ids if embed is not None else None, size)
    except BaseException:
        lm.close()
        raise
    return ModelDrafter(lm if vocab_ids is None else SubsetVocabLM(lm, vocab_ids, size))
