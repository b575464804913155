"""The device plan: which backend, mode and draft shape ``edge-llm-ros plan --device`` chose here.

Contract: one JSON file per machine, written by :func:`save_plan` and read by :func:`load_plan`;
the schema lives in this module only. The file is ``$EDGE_LLM_ROS_PLAN`` if set, else
``~/.config/edge_llm_ros/plan.json`` (``$XDG_CONFIG_HOME`` honoured). What readers use:

    format         "edge_llm_ros.plan/1"
    model          the target file the plan was measured for, as given (for people, and the key of
                   a plan without model_id)
    model_id       the target's identity: {name, size, sha256} (core/planning/identity.py); a plan
                   is used for a model of the same size and content wherever it lies (optional:
                   absent in plans written before it was kept, and for a model that is no file)
    machine        where it was measured: {cpu, cpu_count, arch, ...}; a plan is used only on a
                   machine with the same cpu, cpu_count and arch (those the record has)
    threads        the thread count it was measured with
    draft_backend  where to draft ("torch" | "llama.cpp"): the chosen candidate's draft, else
                   (``ar``) the draft cheapest per token, for drafting elsewhere (edge-cloud)
    choice         the chosen candidate: {backend, mode, gamma, tree, draft_backend, tokens_per_s};
                   gamma: sd's chain length (0 otherwise); tree: null or {depth, branch, expand, width}

Everything else in the file (row costs, τ per γ and per tree, every scored candidate) is kept
to check the plan against ``bench``; readers ignore it. Knows nothing about ROS.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..engine.config import MODES, GenerationConfig, preset
from ..engine.drafters import TreeSpec
from .identity import describe, machine_differences, model_identity, same_content

PLAN_ENV = "EDGE_LLM_ROS_PLAN"
FORMAT = "edge_llm_ros.plan/1"
BACKENDS = ("torch", "llama.cpp")
TREE_MODES = ("tree", "llmcad")


class PlanError(ValueError):
    """A plan file that exists but cannot be read as a plan (the message names the file)."""


class PlanWarning(UserWarning):
    """A plan was skipped (measured for another model, or on another machine)."""


def default_plan_path() -> Path:
    """``$EDGE_LLM_ROS_PLAN``, else ``$XDG_CONFIG_HOME/edge_llm_ros/plan.json`` (``~/.config`` by default)."""
    if os.environ.get(PLAN_ENV):
        return Path(os.environ[PLAN_ENV]).expanduser()
    root = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
    return root / "edge_llm_ros" / "plan.json"


def shape_text(mode: str, gamma: int = 0, tree: TreeSpec | None = None) -> str:
    """The draft shape of a mode in a few characters: ``γ=2``, ``W=7 depth 4``, '' for ``ar``."""
    if mode == "sd":
        return f"γ={gamma}"
    if mode in TREE_MODES and tree is not None:
        return f"W={tree.width} depth {tree.depth}"
    return ""


@dataclass(frozen=True)
class DevicePlan:
    """What a saved plan tells a reader: run ``mode`` with this shape on ``backend``."""

    backend: str  # the target's backend: "torch" | "llama.cpp"
    mode: str
    gamma: int  # sd: drafted tokens per round; 0 for other modes
    tree: TreeSpec | None  # tree modes: the verified tree's shape
    draft_backend: str  # "torch" | "llama.cpp": where to draft
    predicted_tok_s: float
    model: str  # the target file it was measured for, as given
    threads: int
    path: Path | None = None  # the file it was read from
    model_id: dict | None = None  # {name, size, sha256} of the target (identity.model_identity)
    machine: dict | None = None  # where it was measured (identity.this_machine)

    def overrides(self) -> dict:
        """The plan's shape as GenerationConfig fields (``gamma`` or ``tree_*``)."""
        if self.mode == "sd":
            return {"gamma": self.gamma}
        if self.mode in TREE_MODES and self.tree is not None:
            t = self.tree
            return {"tree_depth": t.depth, "tree_branch": t.branch, "tree_expand": t.expand, "tree_width": t.width}
        return {}

    def config(self, **overrides) -> GenerationConfig:
        """The mode's preset with the plan's shape; ``overrides`` (explicit settings) win."""
        return preset(self.mode, **{**self.overrides(), **overrides})

    def describe(self) -> str:
        """``sd γ=2 on llama.cpp, draft on llama.cpp``."""
        shape = shape_text(self.mode, self.gamma, self.tree)
        draft = f", draft on {self.draft_backend}" if self.mode != "ar" else ""
        return f"{self.mode}{' ' + shape if shape else ''} on {self.backend}{draft}"


# -- writing ------------------------------------------------------------------------------------


def tree_record(tree: TreeSpec | None) -> dict | None:
    return None if tree is None else {"depth": tree.depth, "branch": tree.branch, "expand": tree.expand,
                                      "width": tree.width}


def candidate(backend: str, mode: str, tokens_per_s: float, gamma: int = 0, tree: TreeSpec | None = None,
              draft_backend: str | None = None) -> dict:
    """One scored candidate as the file keeps it (the ``choice`` is one of these); ``draft_backend``:
    where its draft runs (None for ``ar``)."""
    return {"backend": backend, "mode": mode, "gamma": gamma, "tree": tree_record(tree),
            "draft_backend": draft_backend, "tokens_per_s": tokens_per_s}


def plan_record(choice: dict, *, model: str | os.PathLike, threads: int, draft_backend: str, **measurements) -> dict:
    """The JSON object of a plan: the fields readers use, then the measurements kept beside them.
    ``model_id`` is the identity of ``model`` where that is a file or folder (a name has none);
    ``machine`` (identity.this_machine) is kept when given."""
    record = {"format": FORMAT, "model": str(model), "threads": threads, "draft_backend": draft_backend,
              "choice": choice}
    identity = model_identity(model) if str(model) else None
    if identity is not None:
        record["model_id"] = identity
    record.update({k: v for k, v in measurements.items() if k not in record})
    parse_plan(record)  # what is written can be read back
    return record


def save_plan(record: dict, path: str | os.PathLike | None = None) -> Path:
    """Write ``record`` (from :func:`plan_record`) to ``path`` (default :func:`default_plan_path`), atomically."""
    path = Path(path) if path is not None else default_plan_path()
    parse_plan(record, path)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(record, indent=2, ensure_ascii=False) + "\n")
    partial.replace(path)
    return path


# -- reading ------------------------------------------------------------------------------------


def _field(record: dict, key: str, kind: type | tuple[type, ...], where: str):
    value = record.get(key)
    if not isinstance(value, kind) or isinstance(value, bool):
        kinds = kind if isinstance(kind, tuple) else (kind,)
        raise PlanError(f"{where}: {key!r} is missing or not {' or '.join(k.__name__ for k in kinds)}")
    return value


def parse_plan(record, path: Path | None = None) -> DevicePlan:
    """A :class:`DevicePlan` from a plan's JSON object; PlanError saying what is wrong."""
    where = f"plan {path}" if path is not None else "plan"
    if not isinstance(record, dict):
        raise PlanError(f"{where}: expected a JSON object, got {type(record).__name__}")
    if record.get("format") != FORMAT:
        raise PlanError(f"{where}: format {record.get('format')!r}, expected {FORMAT!r} "
                        "(edge-llm-ros plan --device writes a current one)")
    choice = _field(record, "choice", dict, where)
    backend, mode = choice.get("backend"), choice.get("mode")
    draft_backend = record.get("draft_backend")
    for name, value, allowed in (("backend", backend, BACKENDS), ("mode", mode, MODES),
                                 ("draft_backend", draft_backend, BACKENDS)):
        if value not in allowed:
            raise PlanError(f"{where}: {name} {value!r} is not one of {', '.join(allowed)}")
    gamma = _field(choice, "gamma", int, where)
    if mode == "sd" and gamma < 1:
        raise PlanError(f"{where}: mode sd needs gamma >= 1, got {gamma}")
    tree = None
    if choice.get("tree") is not None:
        shape = _field(choice, "tree", dict, where)
        try:
            tree = TreeSpec(**{k: int(shape[k]) for k in ("depth", "branch", "expand", "width")})
        except (KeyError, TypeError, ValueError) as exc:
            raise PlanError(f"{where}: tree {shape!r} needs integer depth, branch, expand and width") from exc
        if min(tree.depth, tree.branch, tree.expand, tree.width) < 1:
            raise PlanError(f"{where}: tree {shape!r} needs every size >= 1")
    if mode in TREE_MODES and tree is None:
        raise PlanError(f"{where}: mode {mode} needs a tree shape")
    threads = _field(record, "threads", int, where)
    if threads < 1:
        raise PlanError(f"{where}: threads must be >= 1, got {threads}")
    model_id = record.get("model_id")
    if model_id is not None and not (isinstance(model_id, dict) and isinstance(model_id.get("name"), str)
                                     and isinstance(model_id.get("size"), int)
                                     and isinstance(model_id.get("sha256"), str)):
        raise PlanError(f"{where}: model_id {model_id!r} needs a name, a size and a sha256")
    machine = record.get("machine")
    if machine is not None and not isinstance(machine, dict):
        raise PlanError(f"{where}: machine {machine!r} is not an object")
    return DevicePlan(
        backend=backend,
        mode=mode,
        gamma=gamma,
        tree=tree,
        draft_backend=draft_backend,
        predicted_tok_s=float(_field(choice, "tokens_per_s", (int, float), where)),
        model=_field(record, "model", str, where),
        threads=threads,
        path=path,
        model_id=model_id,
        machine=machine,
    )


def same_model(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    """The same path (or name)."""
    return str(a) == str(b) or Path(a).expanduser().resolve() == Path(b).expanduser().resolve()


def refusal(plan: DevicePlan, model: str | os.PathLike | None) -> str:
    """'' when ``plan`` holds for ``model`` (None: any) on this machine, else why it does not.

    The machine first (cpu, core count, architecture). Then the model's identity: the same size and
    content hash wherever the file lies. A plan without one (written before it was kept), or a model
    that is no file, is matched by path or name, or by the content of the file the plan names if
    that file is still there."""
    where = f"plan {plan.path}" if plan.path is not None else "the plan"
    differences = machine_differences(plan.machine or {})
    if differences:
        return f"{where} was measured on another machine ({'; '.join(differences)})"
    if model is None:
        return ""
    here = model_identity(model)
    if plan.model_id is not None and here is not None:
        if same_content(plan.model_id, here):
            return ""
        return f"{where} was measured for another model: {describe(plan.model_id)}, not {model} ({describe(here)})"
    if same_model(plan.model, model):
        return ""
    if plan.model_id is None and here is not None and same_content(model_identity(plan.model), here):
        return ""  # a plan from before model_id, for a file with the same content as this one
    old = (" (a plan written before model identities were kept names its model by path; edge-llm-ros plan "
           "--device measures a new one)") if plan.model_id is None else ""
    return f"{where} was measured for {plan.model}, not {model}{old}"


def load_plan(
    path: str | os.PathLike | None = None,
    model: str | os.PathLike | None = None,
    warn: Callable[[str], None] | None = None,
) -> DevicePlan | None:
    """The saved plan at ``path`` (default :func:`default_plan_path`), if it holds for ``model`` here.

    None when there is no file. A file that cannot be read as a plan raises :class:`PlanError`
    naming it. A plan measured on another machine, or for another model than ``model`` (None: the
    model is not checked; :func:`refusal` says how models are matched), is skipped: None, after
    ``warn(reason)`` (a logger's method; default ``warnings.warn`` with :class:`PlanWarning`).
    """
    path = Path(path).expanduser() if path is not None else default_plan_path()
    if not path.exists():
        return None
    try:
        record = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError) as exc:
        raise PlanError(f"plan {path}: cannot read it: {exc}") from exc
    except ValueError as exc:
        raise PlanError(f"plan {path}: not JSON: {exc}") from exc
    plan = parse_plan(record, path)
    reason = refusal(plan, model)
    if reason:
        if warn is None:
            warnings.warn(reason, PlanWarning, stacklevel=2)
        else:
            warn(reason)
        return None
    return plan


def planned_draft_backend(model: str | None = None, warn=None) -> str | None:
    """The saved device plan's ``draft_backend`` for ``model`` (default SmolLM2; ``edge-llm-ros plan
    --device``). None: no plan saved, or one measured for another model (``warn(reason)`` says so)."""
    from ..engine.models import default_model_path

    try:
        plan = load_plan(model=model or default_model_path(), warn=warn)
    except OSError as exc:
        raise PlanError(f"cannot read the saved device plan: {exc}") from exc
    return None if plan is None else plan.draft_backend
