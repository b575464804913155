"""Trained draft models: build one for a target, save it, load it back as a drafter.

Contract: a draft is a shallow decoder of the target's own architecture (same hidden
size, heads, rotary), with K decoder layers initialised from chosen target layers and its
own final norm. It shares the target's tokenizer, token embeddings and LM head (SmolLM2
ties them): those are taken from the target at load time and never stored, so a draft
file holds only what is its own (K layers + norm, fp16) and a vocabulary subset its head
scores (frequency ranked; the verifier always scores the full vocabulary, so the subset
costs acceptance, never correctness). Knows nothing about ROS.

On disk, a directory:

    config.json         format, K, the target layers it started from, the model config,
                        the target's identity (model type, vocab size, hidden size,
                        sha256 of the tokenizer's token->id table), training metadata
    model.safetensors   "layers.<k>.<param>" and "norm.weight" in fp16, "vocab_ids" (int32),
                        and "fc.*" for a feature head (kind "heads", see FeatureDrafter below)

Loading refuses a target whose identity differs, naming what differs.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch

from edge_llm_ros import DATA

from ..engine.drafters import ModelDrafter, TreeSpec
from ..engine.models import TorchCausalLM, target_identity
from ..engine.sampling import Sampler
from ..engine.tree import TokenTree

DRAFTERS_DIR = DATA / "drafters"
DEFAULT_DRAFT = "smollm2-135m-instruct"
DRAFT_FORMAT = "edge_llm_ros.draft/1"
INIT_MODES = ("first", "spread")
CONFIG_FILE, WEIGHTS_FILE = "config.json", "model.safetensors"
# Config entries that describe the target checkpoint, not the draft's architecture.
_DROP_CONFIG = ("quantization_config", "_name_or_path", "architectures", "transformers_version", "dtype", "torch_dtype")


class DraftMismatchError(ValueError):
    """The draft was trained for a different target (vocabulary, tokenizer or width)."""


@dataclass
class Draft:
    """A draft model for one target: the model view, its vocabulary subset and its provenance."""

    model: TorchCausalLM
    init_layers: list[int]
    vocab_ids: torch.Tensor | None = None
    training: dict = field(default_factory=dict)
    name: str = "draft"
    fc: torch.nn.Linear | None = None  # set for a feature head (EAGLE style, see FeatureDrafter below)

    @property
    def num_layers(self) -> int:
        return len(self.init_layers)

    @property
    def kind(self) -> str:
        return "draft" if self.fc is None else "heads"

    def drafter(self) -> ModelDrafter:
        if self.fc is not None:
            return FeatureDrafter(self)
        return ModelDrafter(self.model, self.vocab_ids)


def init_layer_ids(num_target_layers: int, num_layers: int, init: str = "first") -> list[int]:
    """Which target layers seed the draft: the first K, or K spread evenly from first to last."""
    if not 1 <= num_layers <= num_target_layers:
        raise ValueError(f"a draft needs 1..{num_target_layers} layers, got {num_layers}")
    if init == "first":
        return list(range(num_layers))
    if init == "spread":
        if num_layers == 1:
            return [0]
        step = (num_target_layers - 1) / (num_layers - 1)
        return [round(i * step) for i in range(num_layers)]
    raise ValueError(f"unknown init {init!r}; expected one of {', '.join(INIT_MODES)}")


def _draft_config(target: TorchCausalLM, num_layers: int, model_config: dict | None = None):
    """The target's config class with K layers (or a stored config dict), for this draft."""
    config_cls = type(target.config)
    if model_config is None:
        model_config = {k: v for k, v in target.config.to_dict().items() if k not in _DROP_CONFIG}
    config = config_cls.from_dict({**model_config, "num_hidden_layers": num_layers})
    config.vocab_size = target.vocab_size
    return config


def _assemble(target: TorchCausalLM, config) -> TorchCausalLM:
    """An HF model of ``config`` whose embeddings and head are the target's own modules."""
    from transformers import AutoModelForCausalLM

    torch_dtype = target.dtype
    hf = AutoModelForCausalLM.from_config(config, dtype=torch_dtype)
    hf.model.embed_tokens = target.embed_tokens
    hf.lm_head = target.lm_head
    hf.to(target.device).eval()
    hf.requires_grad_(False)
    return TorchCausalLM(hf, target.tokenizer)


def build_draft(
    target: TorchCausalLM,
    num_layers: int = 2,
    init: str = "first",
    layer_ids: list[int] | None = None,
    vocab_ids: torch.Tensor | None = None,
    name: str = "draft",
) -> Draft:
    """A fresh draft: copies of target layers ``layer_ids`` (default: chosen by ``init``) and of its norm."""
    total = target.config.num_hidden_layers
    layer_ids = init_layer_ids(total, num_layers, init) if layer_ids is None else list(layer_ids)
    if len(layer_ids) != num_layers or not all(0 <= i < total for i in layer_ids):
        raise ValueError(f"need {num_layers} layer ids in [0, {total}), got {layer_ids}")
    model = _assemble(target, _draft_config(target, num_layers))
    source = target.hf.model.layers
    with torch.no_grad():
        for k, i in enumerate(layer_ids):
            model.hf.model.layers[k].load_state_dict(source[i].state_dict())
        model.norm.load_state_dict(target.norm.state_dict())
    return Draft(model, layer_ids, vocab_ids, {}, name)


def own_state_dict(draft: Draft) -> dict[str, torch.Tensor]:
    """The weights a draft file stores: its layers and norm (fp16), and its vocabulary subset."""
    inner = draft.model.hf.model
    state = {f"layers.{k}": v for k, v in inner.layers.state_dict().items()}
    state.update({f"norm.{k}": v for k, v in inner.norm.state_dict().items()})
    if draft.fc is not None:
        state.update({f"fc.{k}": v for k, v in draft.fc.state_dict().items()})
    state = {k: v.detach().to(torch.float16).contiguous() for k, v in state.items()}
    if draft.vocab_ids is not None:
        state["vocab_ids"] = draft.vocab_ids.to(torch.int32).contiguous()
    return state


def save_draft(draft: Draft, path: str | os.PathLike, target: TorchCausalLM) -> Path:
    """Write ``config.json`` + ``model.safetensors`` into directory ``path`` (created)."""
    from safetensors.torch import save_file

    folder = Path(path)
    folder.mkdir(parents=True, exist_ok=True)
    model_config = {k: v for k, v in draft.model.hf.config.to_dict().items() if k not in _DROP_CONFIG}
    config = {
        "format": DRAFT_FORMAT,
        "kind": draft.kind,
        "name": draft.name,
        "num_layers": draft.num_layers,
        "init_layers": list(draft.init_layers),
        "vocab_subset": None if draft.vocab_ids is None else int(len(draft.vocab_ids)),
        "target": target_identity(target),
        "model_config": model_config,
        "training": draft.training,
    }
    save_file(own_state_dict(draft), str(folder / WEIGHTS_FILE), metadata={"format": DRAFT_FORMAT})
    (folder / WEIGHTS_FILE).chmod(0o644)  # safetensors writes 0600; a shipped file must be readable
    (folder / CONFIG_FILE).write_text(json.dumps(config, indent=2, sort_keys=False) + "\n", encoding="utf-8")
    return folder


def read_config(path: str | os.PathLike, expected_format: str = DRAFT_FORMAT, what: str = "draft") -> dict:
    """``config.json`` of a ``what`` directory (which must hold ``model.safetensors`` too), refused
    unless its format is ``expected_format``. Shared with the exits files (:mod:`.exits`)."""
    folder = Path(path)
    file = folder / CONFIG_FILE
    if not file.is_file() or not (folder / WEIGHTS_FILE).is_file():
        article = "an" if what[0] in "aeiou" else "a"
        raise FileNotFoundError(f"{folder} is not {article} {what} directory (needs {CONFIG_FILE} and {WEIGHTS_FILE})")
    config = json.loads(file.read_text(encoding="utf-8"))
    if config.get("format") != expected_format:
        raise ValueError(f"{file}: unknown {what} format {config.get('format')!r}, expected {expected_format!r}")
    return config


def read_weights(
    path: str | os.PathLike, expected: set[str], vocab_size: int, what: str = "draft"
) -> tuple[dict[str, torch.Tensor], torch.Tensor | None]:
    """The tensors of ``model.safetensors`` in directory ``path``, refused unless their names are
    ``expected``, and the vocabulary subset stored beside them ("vocab_ids", long; None if absent),
    refused outside [0, vocab_size). Shared with the exits files (:mod:`.exits`)."""
    from safetensors.torch import load_file

    folder = Path(path)
    state = load_file(str(folder / WEIGHTS_FILE))
    vocab_ids = state.pop("vocab_ids", None)
    if vocab_ids is not None:
        vocab_ids = vocab_ids.to(torch.long)
        if vocab_ids.numel() and (int(vocab_ids.min()) < 0 or int(vocab_ids.max()) >= vocab_size):
            raise ValueError(f"{what} {folder}: vocab_ids outside [0, {vocab_size})")
    if set(state) != expected:
        missing, extra = sorted(expected - set(state)), sorted(set(state) - expected)
        raise ValueError(
            f"{what} {folder}: weights do not fit the config (missing {missing[:3]}, unexpected {extra[:3]})"
        )
    return state, vocab_ids


def check_target(config: dict, target: TorchCausalLM, where: str = "draft") -> None:
    """Refuse a target that is not the one the draft was trained for, naming every difference."""
    theirs, ours = config["target"], target_identity(target)
    problems = []
    for key, what in (("vocab_size", "vocabulary size"), ("hidden_size", "hidden size"), ("model_type", "model type")):
        if theirs.get(key) != ours.get(key):
            problems.append(f"{what}: draft {theirs.get(key)}, target {ours.get(key)}")
    if theirs.get("tokenizer_sha256") != ours.get("tokenizer_sha256"):
        problems.append(
            "tokenizer: the target's token->id table differs from the one the draft was trained with "
            f"(sha256 {str(ours.get('tokenizer_sha256'))[:12]} vs {str(theirs.get('tokenizer_sha256'))[:12]})"
        )
    if problems:
        raise DraftMismatchError(f"{where} was trained for another target; " + "; ".join(problems))


def load_draft(target: TorchCausalLM, path: str | os.PathLike | None = None) -> Draft:
    """Load a draft directory (default: the shipped draft for SmolLM2-135M-Instruct) onto ``target``."""
    folder = default_draft_path() if path is None else Path(path)
    config = read_config(folder)
    check_target(config, target, where=f"draft {folder}")
    model = _assemble(target, _draft_config(target, config["num_layers"], config["model_config"]))
    inner = model.hf.model
    fc = None
    if config.get("kind", "draft") == "heads":
        fc = new_fc(target.config.hidden_size, target.dtype).to(target.device)
    elif config.get("kind", "draft") != "draft":
        raise ValueError(f"draft {folder}: unknown kind {config.get('kind')!r}, expected 'draft' or 'heads'")
    expected = {f"layers.{k}" for k in inner.layers.state_dict()} | {f"norm.{k}" for k in inner.norm.state_dict()}
    if fc is not None:
        expected |= {f"fc.{k}" for k in fc.state_dict()}
    state, vocab_ids = read_weights(folder, expected, target.vocab_size, "draft")
    with torch.no_grad():
        inner.layers.load_state_dict({k[len("layers.") :]: v for k, v in state.items() if k.startswith("layers.")})
        inner.norm.load_state_dict({k[len("norm.") :]: v for k, v in state.items() if k.startswith("norm.")})
        if fc is not None:
            fc.load_state_dict({k[len("fc.") :]: v for k, v in state.items() if k.startswith("fc.")})
    training = config.get("training", {})
    return Draft(model, list(config["init_layers"]), vocab_ids, training, config.get("name", folder.name), fc)


def load_drafter(target: TorchCausalLM, path: str | os.PathLike | None = None) -> ModelDrafter:
    """The drafter of the draft in ``path`` (None: the shipped default for SmolLM2): a
    :class:`ModelDrafter`, or a :class:`FeatureDrafter` for a feature head."""
    return load_draft(target, path).drafter()


def default_draft_path(name: str = DEFAULT_DRAFT) -> Path:
    return shipped_path(DRAFTERS_DIR, name, "draft", "train one with: edge-llm-ros train draft")


def shipped_path(root: Path, name: str, what: str = "draft", hint: str = "") -> Path:
    """The shipped ``what`` directory ``root/name``; if it is missing, an error naming those available
    and ``hint`` (how to make one). Shared with the exits files (:mod:`.exits`)."""
    folder = root / name
    if not (folder / CONFIG_FILE).is_file():
        available = sorted(p.name for p in root.glob("*") if (p / CONFIG_FILE).is_file())
        raise FileNotFoundError(
            f"no shipped {what} {name!r} in {root} (available: {', '.join(available) or 'none'}); {hint}"
        )
    return folder


# -- feature heads (EAGLE style) ---------------------------------------------------------------------
#
# A feature head drafts from the target's last-layer hidden states ("features", before the final
# norm) instead of from tokens alone. After Li et al. 2024 (EAGLE, §4.1): row i of the head reads
# the pair (f_i, e(x_{i+1})) — the target's feature of token i and the embedding of the token after
# it — through a fully connected layer ``fc`` [2E -> E] and one decoder layer of the target's
# architecture, and outputs f̂_{i+1}, a prediction of the next feature; the target's final norm + LM
# head turn it into the distribution of x_{i+2}. While drafting a tree, a node's predicted feature
# stands in for the target's (which does not exist yet) when its children are drafted. After each
# verification the engine hands the drafter the target's real features of the accepted tokens
# (:meth:`FeatureDrafter.observe`), and the rows computed from predicted features are dropped.
# A head is stored like a draft model: one layer, a norm, the vocabulary subset, plus ``fc``; the
# target's embeddings and head are shared. Training: core/training/heads.py.

def new_fc(hidden_size: int, dtype: torch.dtype = torch.float32) -> torch.nn.Linear:
    """fc [2E -> E] initialised to f + e: the layer first sees what a decoder layer sees (a residual stream)."""
    fc = torch.nn.Linear(2 * hidden_size, hidden_size, bias=True, dtype=dtype)
    with torch.no_grad():
        eye = torch.eye(hidden_size, dtype=dtype)
        fc.weight.copy_(torch.cat([eye, eye], dim=1))
        fc.bias.zero_()
    fc.requires_grad_(False)
    return fc


def build_heads(
    target: TorchCausalLM, vocab_ids: torch.Tensor | None = None, init_layer: int | None = None, name: str = "heads"
) -> Draft:
    """A fresh feature head: one decoder layer copied from target layer ``init_layer`` (default: the
    last, whose input distribution is closest to a feature's), the target's final norm, and ``fc``."""
    last = target.config.num_hidden_layers - 1
    draft = build_draft(target, 1, layer_ids=[last if init_layer is None else init_layer], vocab_ids=vocab_ids,
                        name=name)
    draft.fc = new_fc(target.config.hidden_size, target.dtype).to(target.device)
    return draft


def head_inputs(head: Draft, features: torch.Tensor, next_ids: torch.Tensor) -> torch.Tensor:
    """fc(cat(f_i, e(x_{i+1}))): features [..., E], next_ids [...] -> [..., E]."""
    with torch.no_grad():
        embeds = head.model.embed_tokens(next_ids)
    return head.fc(torch.cat([features.to(embeds.dtype), embeds], dim=-1))


class FeatureDrafter(ModelDrafter):
    """Drafts trees from the target's features with a trained head (EAGLE-style, see module doc).

    Cache slot i holds row i, the pair (f_i, x_{i+1}); with N + 1 context tokens the
    rows 0..N-1 are exact (their features come from the target) and row N-1 — the
    root's row — predicts the root's children. Tree rows follow and are dropped on the
    next ``propose``. Needs :meth:`observe` from the engine (``generate`` calls it).
    """

    needs_features = True

    def __init__(self, head: Draft) -> None:
        if head.fc is None:
            raise ValueError(f"{head.name} is not a feature head (no fc layer)")
        super().__init__(head.model, head.vocab_ids)
        self.head = head
        self.features = torch.empty(0, head.model.config.hidden_size, dtype=head.model.dtype)
        self.known = 0  # features of context tokens [0, known) are the target's
        self.rows_of: list[int] = []  # the context tokens x_0..x_R the R exact cached rows were built from
        self._hidden: dict[int, torch.Tensor] = {}  # tree node -> its row's output (predicted feature)

    def observe(self, start: int, hidden: torch.Tensor) -> None:
        """The target's features [T, E] of context tokens start..start+T-1 (later ones are forgotten)."""
        end = start + hidden.shape[0]
        if end > self.features.shape[0]:
            grown = torch.empty(max(end, 2 * self.features.shape[0], 256), self.features.shape[1],
                                dtype=self.features.dtype)
            grown[: self.known] = self.features[: self.known]
            self.features = grown
        self.features[start:end] = hidden.detach().to(self.features.dtype)
        self.known = end
        self.rows_of = self.rows_of[: start + 1]  # row i read f_i: rows from ``start`` on are stale

    def _sync(self, context: list[int]) -> torch.Tensor:
        """Rows 0..N-1 exact in the cache; returns the root's draft logits [V]."""
        n = len(context) - 1
        if self.known < n:
            raise RuntimeError(
                f"{type(self).__name__} needs the target's features of the context ({self.known} of {n} known); "
                "drive it through generate(), which passes them on"
            )
        common = 0
        for a, b in zip(self.rows_of, context):
            if a != b:
                break
            common += 1
        rows = max(0, min(len(self.rows_of), common) - 1)
        self.cache.truncate(rows)
        self.cache.ensure_capacity(n + 1)
        with torch.inference_mode():
            inputs = head_inputs(self.head, self.features[rows:n], torch.tensor(context[rows + 1 : n + 1]))
            out = self._rows(inputs, torch.arange(rows + 1, n + 1), None)
        self.rows_of = list(context)
        self._hidden = {0: out[-1]}
        return self._head(out[-1:][None])[0]

    def _feed(self, tree: TokenTree, nodes: list[int], root_slot: int) -> torch.Tensor:
        """Rows for ``nodes``: (parent's predicted feature, own token), at position N + depth."""
        mask, positions = self._tree_rows(tree, nodes, root_slot - 1)  # the root's row is slot N-1
        with torch.inference_mode():
            parents = torch.stack([self._hidden[tree.parents[n]] for n in nodes])
            inputs = head_inputs(self.head, parents, torch.tensor([tree.tokens[n] for n in nodes]))
            out = self._rows(inputs, positions + 1, mask)
        for row, node in enumerate(nodes):
            self._hidden[node] = out[row]
        return self._head(out[None])

    def propose(self, context: list[int], spec: TreeSpec, sampler: Sampler) -> TokenTree:
        if len(context) < 2:  # no feature yet: the first round is a plain decode step
            return TokenTree.from_root(context[-1])
        tree = super().propose(context, spec, sampler)
        self._tree = None  # tree rows are built from predicted features: never reused
        return tree
