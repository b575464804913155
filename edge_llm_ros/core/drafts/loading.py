"""Models by name: the target, the drafter a draft spec names, on torch or llama.cpp.

What the command-line tools and the nodes load from their flags and parameters. Knows
nothing about ROS or argparse; a name that cannot be loaded is a :class:`LoadError`.

Draft specs:

    shallow[:K[:V]]  the target's first K layers + its final norm and head (ModelDrafter
                     over a shallow view sharing the target's weights); V > 0 restricts
                     the draft head to token ids [0, V) (byte-level BPE ids are roughly
                     frequency ranked; the verifier always uses the full vocabulary)
    lookup           prompt lookup (n-gram), training-free
    exit:K[:PATH]    self-draft: the target's first K layers + the trained early exit at
                     layer K-1 (0-based) + the target's norm and head (ExitDrafter);
                     exits from PATH (``edge-llm-ros train exits``), default the shipped ones
    PATH             a trained draft folder (``edge-llm-ros train draft``, loaded by
                     ``load_drafter``), or a draft model: a directory with an HF config.json
                     or a .gguf file, loaded as an independent causal LM with the target's
                     tokenizer
    llama.cpp        the shipped trained draft exported to GGUF, run by llama.cpp on the CPU
                     (``load_llama_drafter``; exported once into the model cache)
    llama.cpp:PATH   any GGUF draft (PATH a .gguf file) run by llama.cpp; its vocabulary must
                     be the target's token for token, or it is refused before generation

With no spec: :func:`default_draft` (the shipped trained draft, else ``shallow`` with
:func:`default_shallow_layers`).
"""

from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..engine.drafters import Drafter, ModelDrafter, PromptLookupDrafter
from ..engine.llama_backend import LlamaCppError, llama_cpp_available, load_llama_cpp
from ..engine.models import TorchCausalLM, default_model_path, load_model, load_tokenizer, tiny_llama
from .draft_models import load_drafter
from .gguf import load_llama_drafter

# The default shallow draft keeps this fraction of the target's layers (10 of SmolLM2's 30).
SHALLOW_FRACTION = 1 / 3
LLAMA_CPP = "llama.cpp"
DRAFT_BACKENDS = ("auto", "torch", LLAMA_CPP)


class LoadError(ValueError):
    """A model, draft spec, draft backend or thread count that cannot be loaded or used; says why in one line."""


def one_line(exc: BaseException) -> str:
    """An exception's message on one line (its type's name when it has none)."""
    return " ".join(str(exc).split()) or type(exc).__name__


# -- targets ------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=2)
def load_target(model: str | None = None, tiny: bool = False) -> TorchCausalLM:
    """The target model, loaded once per process (``model`` path, or SmolLM2; ``tiny`` for tests)."""
    if model is not None and not Path(model).exists():
        raise LoadError(f"model not found: {model}")
    if tiny:
        return tiny_target()
    try:
        return load_model(model)
    except FileNotFoundError as exc:
        raise LoadError(str(exc)) from exc


def draft_home(model: str | None, spec: str | None) -> TorchCausalLM:
    """What of the target ``model`` the drafter ``spec`` shares, loaded alone when that is less than
    the whole target, so a robot holds its draft and not the target: a trained draft folder (the
    shipped one when ``spec`` is None) shares only the embedding, final norm and head. Anything
    else gets :func:`load_target` (``shallow``/``exit`` drafts run the target's own first layers
    and count them against it; a feature head reads the target's features). A partial home keeps
    the target's config and tokenizer (every check against the target holds) and its first layer;
    its other layers stay on the meta device (core/engine/partial.load_stage_model)."""
    from ..engine.models import weights_folder
    from ..engine.partial import load_stage_model

    layers = _shared_layers(spec)
    if layers is None:
        return load_target(model)
    if model is not None and not Path(model).exists():
        raise LoadError(f"model not found: {model}")
    try:
        return load_stage_model(weights_folder(model), range(max(layers, 1)), first=True, last=True,
                                tokenizer=load_tokenizer(model))
    except (OSError, ValueError) as exc:
        raise LoadError(f"cannot load the draft's share of {model or 'the default model'}: {one_line(exc)}") from exc


def _shared_layers(spec: str | None) -> int | None:
    """The target's first layers ``spec``'s drafter needs (0: only the embedding and head); None:
    the whole target."""
    from .draft_models import DRAFT_FORMAT, default_draft_path

    if spec is None:
        try:
            folder = default_draft_path()
        except FileNotFoundError:
            return None  # default_draft falls back to a shallow draft of the target's layers
    else:
        folder = Path(spec)
    if not is_trained_draft(folder):
        return None
    config = json.loads((folder / "config.json").read_text())
    return 0 if config.get("format") == DRAFT_FORMAT and config.get("kind", "draft") == "draft" else None


def byte_tokenizer():
    """A byte-level tokenizer (id == byte value, then ``<|im_start|>`` 256, ``<|im_end|>`` 257 = EOS)
    with a ChatML template: multi-byte characters span several tokens, as in real BPE vocabularies."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    byte_chars = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: _byte_of(ch) for ch in byte_chars}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<|im_start|>", eos_token="<|im_end|>")
    tok.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    return tok


def _byte_of(ch: str) -> int:
    """Inverse of GPT-2's bytes_to_unicode: printable bytes map to themselves, others to 256 + n."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    others = [b for b in range(256) if b not in printable]
    code = ord(ch)
    return code if code in printable else others[code - 256]


def tiny_target(max_context: int = 256) -> TorchCausalLM:
    """A tiny random Llama (2 layers) with :func:`byte_tokenizer`: real text in and out, in milliseconds."""
    tok = byte_tokenizer()
    target = tiny_llama(vocab_size=len(tok), hidden_size=32, num_layers=2, max_context=max_context, seed=0)
    target.tokenizer = tok
    return target


def usable_cores() -> int:
    """The cores this process may run on: its affinity mask where the OS has one, else every core."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0)) or 1
    return os.cpu_count() or 1


def set_threads(threads: int | None) -> int:
    """torch intra-op threads: ``threads``, or every core this process may run on (its CPU affinity:
    a node started under ``taskset`` or in a cpuset, as robots reserve cores, uses those only)."""
    n = threads or usable_cores()
    if n < 1:
        raise LoadError(f"threads must be >= 1, got {n}")
    torch.set_num_threads(n)
    return n


# -- drafters -----------------------------------------------------------------------------------


@dataclass
class NamedDrafter:
    """A drafter and how to name it in output."""

    spec: str
    drafter: Any
    description: str


def default_shallow_layers(target: TorchCausalLM) -> int:
    n = len(target.layer_ids)
    return max(1, min(n - 1, round(n * SHALLOW_FRACTION))) if n > 1 else 1


def parse_shallow(spec: str, target: TorchCausalLM) -> tuple[int, int | None]:
    """``shallow[:K[:V]]`` -> (K, V or None), checked against the target."""
    parts = spec.split(":")
    if parts[0] != "shallow" or len(parts) > 3:
        raise LoadError(f"bad draft spec {spec!r}: expected shallow[:K[:V]]")
    try:
        values = [int(p) for p in parts[1:]]
    except ValueError:
        raise LoadError(f"bad draft spec {spec!r}: K and V must be integers") from None
    k = values[0] if values else default_shallow_layers(target)
    v = values[1] if len(values) > 1 else None
    n = len(target.layer_ids)
    if not 1 <= k <= n:
        raise LoadError(f"bad draft spec {spec!r}: K must be in [1, {n}] (the target has {n} layers)")
    if v is not None and not 1 <= v <= target.vocab_size:
        raise LoadError(f"bad draft spec {spec!r}: V must be in [1, {target.vocab_size}]")
    return k, v


def check_draft_spec(spec: str | None) -> None:
    """Syntax check before any model is loaded (so a typo fails in milliseconds)."""
    if spec is None or spec == "lookup":
        return
    if is_llama_cpp_spec(spec):
        path = llama_cpp_path(spec)
        if spec != LLAMA_CPP and (path.suffix != ".gguf" or not path.is_file()):
            raise LoadError(f"bad draft spec {spec!r}: expected llama.cpp or llama.cpp:PATH with an existing "
                            ".gguf file")
        if not llama_cpp_available():
            raise LoadError(f"draft {spec!r} needs llama-cpp-python (make install builds it)")
        return
    if spec.split(":")[0] == "exit":
        parts = spec.split(":", 2)
        if len(parts) < 2 or not parts[1].isdigit() or int(parts[1]) < 1:
            raise LoadError(f"bad draft spec {spec!r}: expected exit:K[:PATH] with an integer K >= 1")
        if len(parts) == 3 and not Path(parts[2]).exists():
            raise LoadError(f"bad draft spec {spec!r}: exits directory {parts[2]} not found")
        return
    if spec.split(":")[0] == "shallow":
        parts = spec.split(":")
        if len(parts) > 3 or not all(p.isdigit() for p in parts[1:]):
            raise LoadError(f"bad draft spec {spec!r}: expected shallow[:K[:V]] with integers K, V")
        return
    if not Path(spec).exists():
        raise LoadError(f"bad draft spec {spec!r}: expected shallow[:K[:V]], exit:K, lookup, or an existing draft path")


def build_drafter(spec: str | None, target: TorchCausalLM, *, threads: int | None = None) -> NamedDrafter:
    """The drafter named by ``spec`` (see the module docstring); None: :func:`default_draft`.
    ``threads``: a llama.cpp draft's threads (default: torch's)."""
    if spec is None:
        return default_draft(target)
    check_draft_spec(spec)
    if is_llama_cpp_spec(spec):
        return llama_cpp_draft(spec, target, threads=threads)
    if spec == "lookup":
        drafter = PromptLookupDrafter()
        return NamedDrafter(spec, drafter, f"prompt lookup (n-gram {drafter.min_ngram}..{drafter.max_ngram})")
    if spec.split(":")[0] == "shallow":
        return shallow_draft(spec, target)
    if spec.split(":")[0] == "exit":
        return exit_draft(spec, target)
    return load_draft_path(Path(spec), target)


def exit_draft(spec: str, target: TorchCausalLM) -> NamedDrafter:
    """``exit:K[:PATH]``: an ExitDrafter over the first K layers with the exit at layer K-1."""
    from .exits import load_exit_drafter

    parts = spec.split(":", 2)
    k, path = int(parts[1]), (Path(parts[2]) if len(parts) == 3 else None)
    n = len(target.layer_ids)
    if not 1 <= k < n:
        raise LoadError(f"bad draft spec {spec!r}: K must be in [1, {n - 1}] (the target has {n} layers)")
    try:
        drafter = load_exit_drafter(target, k, path)
    except (OSError, ValueError) as exc:
        raise LoadError(f"cannot use draft {spec!r}: {one_line(exc)}") from exc
    return NamedDrafter(spec, drafter, f"target layers 0..{k - 1} of {n} + trained exit at layer {k - 1} "
                                       f"({describe(drafter)})")


def shallow_draft(spec: str, target: TorchCausalLM) -> NamedDrafter:
    k, v = parse_shallow(spec, target)
    vocab_ids = None if v is None else torch.arange(v)
    drafter = ModelDrafter(target.truncated(k), vocab_ids=vocab_ids)
    head = "full head" if v is None else f"head over token ids [0, {v})"
    n = len(target.layer_ids)
    return NamedDrafter(f"shallow:{k}" + ("" if v is None else f":{v}"), drafter,
                        f"target layers 0..{k - 1} of {n}, {head}, untrained")


def default_draft(target: TorchCausalLM) -> NamedDrafter:
    """The shipped trained draft (:func:`load_drafter`) if it fits ``target``; else ``shallow`` with
    :func:`default_shallow_layers` (untrained), saying why."""
    try:
        drafter = load_drafter(target)
        return NamedDrafter("trained", drafter, f"shipped trained draft ({describe(drafter)})")
    except (OSError, ValueError) as exc:  # none shipped, or made for another target
        reason = f"no shipped trained draft fits: {one_line(exc)}"
    draft = shallow_draft(f"shallow:{default_shallow_layers(target)}", target)
    draft.description += f" ({reason})"
    return draft


def describe(drafter: Drafter) -> str:
    """The drafter's class, and for a model drafter its layers (a torch model) and vocabulary subset."""
    if not isinstance(drafter, ModelDrafter):
        return type(drafter).__name__
    model, vocab = drafter.model, drafter.vocab_ids
    layers = f", {len(model.layer_ids)} layers" if isinstance(model, TorchCausalLM) else ""
    head = f", head over {len(vocab)} token ids" if vocab is not None else ""
    return f"{type(drafter).__name__}{layers}{head}"


def is_trained_draft(path: Path) -> bool:
    """A folder written by ``edge-llm-ros train draft`` (config.json with an edge_llm_ros.draft format)."""
    config = path / "config.json"
    if not (path.is_dir() and config.is_file()):
        return False
    try:
        return str(json.loads(config.read_text()).get("format", "")).startswith("edge_llm_ros.draft")
    except (OSError, ValueError, AttributeError):
        return False


def load_draft_path(path: Path, target: TorchCausalLM) -> NamedDrafter:
    """A trained draft folder (through :func:`load_drafter`), or an independent HF model / GGUF."""
    if is_trained_draft(path):
        try:
            drafter = load_drafter(target, path)
        except (OSError, ValueError) as exc:
            raise LoadError(f"cannot load draft {path}: {one_line(exc)}") from exc
        return NamedDrafter(str(path), drafter, f"trained draft {path.name} ({describe(drafter)})")
    is_model = path.suffix == ".gguf" or (path.is_dir() and (path / "config.json").exists())
    if not is_model:
        raise LoadError(f"cannot load draft {path}: not a trained draft folder, a model folder (config.json) "
                        "or a .gguf file")
    try:
        model = load_model(path)
    except (OSError, ValueError) as exc:
        raise LoadError(f"cannot load draft model {path}: {str(exc).splitlines()[0]}") from exc
    return NamedDrafter(str(path), ModelDrafter(model), f"independent model {path.name}")


# -- drafts on llama.cpp -------------------------------------------------------------------------


def is_llama_cpp_spec(spec: str | None) -> bool:
    return spec is not None and (spec == LLAMA_CPP or spec.startswith(LLAMA_CPP + ":"))


def llama_cpp_path(spec: str) -> Path | None:
    """The GGUF file of a ``llama.cpp[:PATH]`` spec; None: the shipped draft's."""
    return None if spec == LLAMA_CPP else Path(spec[len(LLAMA_CPP) + 1:])


def resolve_draft_backend(backend: str, spec: str | None, planned: str | None = None,
                          available: bool | None = None) -> tuple[str, str | None, str]:
    """(backend, draft spec, why) for a draft node's ``draft_backend`` and ``draft``.

    An explicit draft spec decides the backend (``auto``): ``llama.cpp[:PATH]`` runs on
    llama.cpp, any other on torch. With no spec, ``auto`` takes ``planned`` (the device plan's
    ``draft_backend``), else llama.cpp when llama-cpp-python is importable, else torch; the
    llama.cpp backend's default draft is the shipped one's GGUF (``llama.cpp``) and a .gguf
    PATH becomes ``llama.cpp:PATH``. A spec that contradicts an explicit backend is a LoadError.
    """
    if backend not in DRAFT_BACKENDS:
        raise LoadError(f"expected {' | '.join(DRAFT_BACKENDS)}, got {backend!r}")
    available = llama_cpp_available() if available is None else available
    why = "as set"
    if backend == "auto":
        if spec:
            backend, why = (LLAMA_CPP if is_llama_cpp_spec(spec) else "torch"), "auto: the draft spec's"
        elif planned is not None:
            if planned not in DRAFT_BACKENDS[1:]:
                raise LoadError(f"the device plan's draft_backend is {planned!r}, expected torch or llama.cpp")
            backend, why = planned, "auto: the device plan's"
            if planned == LLAMA_CPP and not available:
                backend, why = "torch", "auto: the device plan says llama.cpp, but llama-cpp-python is not installed"
        else:
            backend = LLAMA_CPP if available else "torch"
            why = f"auto: no device plan, llama-cpp-python {'installed' if available else 'not installed'}"
    if backend == "torch":
        if is_llama_cpp_spec(spec):
            raise LoadError(f"draft {spec!r} runs on llama.cpp, but draft_backend is torch")
        return backend, spec or None, why
    if not available:
        raise LoadError("draft_backend llama.cpp needs llama-cpp-python (make install builds it)")
    if not spec:
        spec = LLAMA_CPP
    elif spec.endswith(".gguf") and not is_llama_cpp_spec(spec):
        spec = f"{LLAMA_CPP}:{spec}"
    elif not is_llama_cpp_spec(spec):
        raise LoadError(f"draft {spec!r} runs on torch; with draft_backend llama.cpp the draft is '' (the shipped "
                        "draft's GGUF), llama.cpp:PATH or a .gguf PATH")
    return backend, spec, why


@dataclass
class TargetVocabulary:
    """What a llama.cpp draft needs of its target: the tokenizer and the size of the target's
    logits, without its weights (the robot of edge-cloud decoding holds no target)."""

    tokenizer: Any
    vocab_size: int
    path: Path


def target_vocabulary(model: str | None = None) -> TargetVocabulary:
    """The target ``model``'s (default SmolLM2) tokenizer and vocabulary size: a GGUF's tokenizer has
    every token of the file; a model folder's config.json says ``vocab_size`` (padded vocabularies)."""
    path = Path(model) if model else default_model_path()
    tokenizer = load_tokenizer(path)
    vocab_size = len(tokenizer)
    if path.is_dir() and (path / "config.json").is_file():
        vocab_size = json.loads((path / "config.json").read_text()).get("vocab_size") or vocab_size
    return TargetVocabulary(tokenizer, vocab_size, path)


def llama_cpp_draft(spec: str, target: TorchCausalLM | TargetVocabulary, *, threads: int | None = None
                    ) -> NamedDrafter:
    """``llama.cpp[:PATH]``: :func:`load_llama_drafter`, a ModelDrafter over its own LlamaCppLM
    (one live cache each: build one per drafting thread) with the target's tokenizer, refused if
    its vocabulary is not the target's."""
    try:
        drafter = load_llama_drafter(target, llama_cpp_path(spec), n_threads=threads)
    except (OSError, ValueError, RuntimeError) as exc:
        raise LoadError(f"cannot use draft {spec!r}: {one_line(exc)}") from exc
    lm, what = drafter.model, ("shipped trained draft" if spec == LLAMA_CPP else "GGUF draft")
    threads = f"{lm.n_threads} thread{'s' * (lm.n_threads != 1)}"
    return NamedDrafter(spec, drafter, f"{what} {lm.path.name} on llama.cpp ({threads})")


def build_drafters(backend: str, spec: str | None, model: str | None, count: int, threads: int | None = None
                   ) -> tuple[list[NamedDrafter], Any]:
    """``count`` drafters named by ``spec`` on ``backend`` (each with model state of its own: one per
    drafting thread) and the target's tokenizer. On llama.cpp only the target's tokenizer is
    loaded (:func:`target_vocabulary`), never its torch weights; ``threads`` per llama.cpp drafter."""
    if backend == LLAMA_CPP:
        target = target_vocabulary(model)
        return [llama_cpp_draft(spec, target, threads=threads) for _ in range(count)], target.tokenizer
    target = draft_home(model, spec)  # what the draft shares of the target, not the whole of it
    return [build_drafter(spec, target) for _ in range(count)], target.tokenizer


# -- target and draft together ------------------------------------------------------------------


def load_models(model: str | None, backend: str, mode: str, threads: int, spec: str | None, *,
                tiny: bool = False) -> tuple[Any, NamedDrafter | None]:
    """(target on ``backend``, its drafter for ``mode``; None for ``ar``). A torch draft for a
    llama.cpp target is built from the torch target (as bench's ``*_llama_cpp`` rows); with a
    llama.cpp draft, or for ``ar``, only the GGUF (and its tokenizer) is loaded. ``tiny``: the
    torch target is :func:`tiny_target` (tests)."""
    speculative = mode != "ar"
    if backend == "torch":
        target = load_target(model, tiny=tiny)
        return target, build_drafter(spec, target, threads=threads) if speculative else None
    if model is not None and not Path(model).exists():
        raise LoadError(f"model not found: {model}")
    home = None  # what the draft needs of the target, and the tokenizer
    if speculative:
        home = target_vocabulary(model) if is_llama_cpp_spec(spec) else load_target(model)
    draft = build_drafter(spec, home, threads=threads) if speculative else None
    try:
        lm = load_llama_cpp(model, n_threads=threads, tokenizer=home.tokenizer if home is not None else "auto")
    except (OSError, ValueError, LlamaCppError) as exc:
        raise LoadError(f"cannot load {model or 'the default model'} on llama.cpp: {one_line(exc)}") from exc
    return lm, draft
