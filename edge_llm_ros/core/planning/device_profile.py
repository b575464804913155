"""Measuring this device for the planner: what the target costs per row, what a draft costs, and τ.

Contract: :func:`calibrate` loads what is measured (:func:`load_subjects`: the torch target,
the target on llama.cpp when it is a GGUF and llama-cpp-python is there, the shipped draft on
each backend), measures it as a :class:`Calibration` says (:func:`measure_device`, a progress
line per phase with the elapsed seconds) and returns a plan record
(:func:`~edge_llm_ros.core.planning.device_plan.plan_record`) holding every measurement, scored by
:func:`~edge_llm_ros.core.planning.planner.choose`; :func:`profile` answers one measuring request.
``edge-llm-ros plan --device`` and planner_node both measure through this module. Knows
nothing about ROS.

What is measured (Ghidorah §III-C: the verification width that pays depends on the hardware):

* per backend, the target's median ms to evaluate n chain rows after a PREFIX-token prefix
  (logits for every row), and to verify a drafted tree of each of the calibration's tree shapes
  (llama.cpp decodes a tree as chains, so that is not cost(W + 1));
* per draft, ms per drafted token (a chain of 4) and per whole tree of each shape, and τ, tokens
  per verification, of ``sd`` per γ and of ``tree`` per shape over calibration prompts (greedy, on
  the torch target: τ depends on the draft and the target, not on the target's backend).

Calibrations: FULL (``plan --device``), QUICK (``--quick``: fewer rows, repeats and tokens) and
FAST (planner_node's start-up: about 10 s on an idle 2-core CPU, loading included), which skips
on top of QUICK: rows 6, 7 and beyond 8 (read off the curve where needed), the warm-up before
each row count (one per curve), 2 of the 3 timed runs per median, all but the ``tree`` preset's
shape, γ above 4, one sd run per γ (τ(γ) for every γ is read off one sd run at the largest γ,
:func:`chain_taus`), and τ of the second draft (the shipped draft's GGUF on llama.cpp reuses
the torch draft's τ: the same weights, Q8_0).
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..engine.config import PRESETS, mean_tau, preset
from ..engine.decoding import draft_step, generate_all
from ..engine.drafters import ModelDrafter, TreeSpec
from ..engine.models import CausalLM, TorchCausalLM, chat_prompt, default_model_path, load_model
from ..engine.sampling import Sampler
from ..engine.timing import median_ms
from .device_plan import plan_record
from .identity import cpu_name, this_machine
from .planner import DraftMeasure, TreeMeasure, choose

PREFIX = 240
LLAMA_CPP = "llama.cpp"
TREE_SHAPES = (TreeSpec(depth=3, branch=2, expand=2, width=4), TreeSpec(depth=4, branch=2, expand=2, width=6),
               PRESETS["tree"].tree_spec())  # trees verified within 8 rows (root + W nodes); the last: the preset
CALIBRATION_PROMPTS = (
    "Go to the kitchen and tell me what is on the table.",
    "Explain how a robot vacuum cleaner maps a room.",
    "Write a Python function that checks whether a number is prime.",
)


@dataclass(frozen=True)
class Calibration:
    """How much to measure: rows timed, repeats per timing, calibration prompts and tokens for τ."""

    name: str
    rows: tuple[int, ...]  # row counts whose cost is timed (1..8 score the candidates)
    repeats: int  # timed runs per median (after one warm-up run)
    prompts: int  # calibration prompts τ is measured on
    tokens: int  # new tokens per calibration prompt
    max_gamma: int  # sd's τ for γ = 1..max_gamma
    trees: tuple[TreeSpec, ...] = TREE_SHAPES
    tau_per_gamma: bool = True  # False: every τ(γ) from one sd run at max_gamma (chain_taus)
    shared_tau: bool = False  # True: drafts after the first reuse its τ (the same draft on another backend)
    warmup: bool = True  # a warm-up run before each target timing; False: one per row curve only


FULL = Calibration("full", rows=(*range(1, 9), 12, 16, 24, 32), repeats=5, prompts=3, tokens=48, max_gamma=6)
QUICK = Calibration("quick", rows=(*range(1, 9), 16, 32), repeats=3, prompts=1, tokens=16, max_gamma=6)
FAST = Calibration("fast", rows=(1, 2, 3, 4, 5, 8), repeats=1, prompts=1, tokens=24, max_gamma=4,
                   trees=(PRESETS["tree"].tree_spec(),), tau_per_gamma=False, shared_tau=True, warmup=False)


# -- what is measured -----------------------------------------------------------------------------


@dataclass
class DraftSubject:
    """A drafter to measure, and where it runs."""

    backend: str
    drafter: ModelDrafter
    description: str


@dataclass
class Subjects:
    """The models measured: the torch target (τ runs on it), the target per backend, the drafts."""

    model: Path  # the target file (the plan is saved for it)
    target: TorchCausalLM
    backends: dict[str, CausalLM]
    drafts: list[DraftSubject]
    threads: int
    skipped: list[str] = field(default_factory=list)  # what could not be loaded, and why

    def close(self) -> None:
        """Free the llama.cpp contexts (the torch models go with the last reference)."""
        for lm in [*self.backends.values(), *(d.drafter.model for d in self.drafts)]:
            if lm is not self.target:
                lm.close()


def load_subjects(model: str | os.PathLike | None = None, threads: int | None = None,
                  llama_cpp: bool = True) -> Subjects:
    """The target ``model`` (default SmolLM2) on torch and, when it is a GGUF and ``llama_cpp`` and
    llama-cpp-python allow, on llama.cpp; the shipped draft on torch and (its GGUF) on llama.cpp.
    ``threads``: llama.cpp's (default torch's). A draft that does not fit the target is skipped
    (``skipped`` says why; with no draft only ``ar`` is planned)."""
    from ..drafts.draft_models import load_drafter
    from ..drafts.gguf import load_llama_drafter
    from ..engine.llama_backend import llama_cpp_available, load_llama_cpp

    path = Path(model).expanduser().resolve() if model else default_model_path().resolve()
    threads = threads or torch.get_num_threads()
    target = load_model(path)
    subjects = Subjects(path, target, {"torch": target}, [], threads)
    try:
        subjects.drafts.append(DraftSubject("torch", load_drafter(target), "shipped trained draft on torch"))
    except (OSError, ValueError) as exc:
        subjects.skipped.append(f"torch draft: {' '.join(str(exc).split())}")
    if not llama_cpp:
        subjects.skipped.append("llama.cpp: not allowed")
    elif not llama_cpp_available():
        subjects.skipped.append("llama.cpp: llama-cpp-python is not installed")
    elif path.suffix != ".gguf":
        subjects.skipped.append(f"llama.cpp: {path.name} is not a GGUF file")
    else:
        subjects.backends[LLAMA_CPP] = load_llama_cpp(path, n_threads=threads, tokenizer=target.tokenizer)
        try:
            drafter = load_llama_drafter(target, None, n_threads=threads)
            subjects.drafts.append(DraftSubject(LLAMA_CPP, drafter, f"shipped trained draft's GGUF on llama.cpp "
                                                                    f"({threads} threads)"))
        except (OSError, ValueError, RuntimeError) as exc:
            subjects.skipped.append(f"llama.cpp draft: {' '.join(str(exc).split())}")
    return subjects


# -- timing ---------------------------------------------------------------------------------------


def row_costs(model, rows: Sequence[int], repeats: int, prefix: int = PREFIX, warmup: bool = True
              ) -> dict[int, float]:
    """Median ms to evaluate n rows (logits for each) after a ``prefix``-token prefix, per n (``warmup``:
    a warm-up run before each n; else one of the most rows before them all)."""
    cache = model.new_cache(prefix + max(rows) + 8)
    prefix_ids = [(1000 + 7 * i) % model.vocab_size for i in range(prefix)]

    def evaluate(n: int, r: int) -> None:
        ids = torch.tensor([(2000 + 13 * (i + r)) % model.vocab_size for i in range(n)])
        model.forward(ids, torch.arange(prefix, prefix + n), None, cache)

    with torch.inference_mode():
        model.forward(torch.tensor(prefix_ids), torch.arange(prefix), None, cache, logits_rows=None)
        if not warmup:
            median_ms(lambda r: evaluate(max(rows), r), 1, lambda: cache.truncate(prefix), warmup=False)
        return {n: median_ms(lambda r, n=n: evaluate(n, r), repeats, lambda: cache.truncate(prefix), warmup)
                for n in rows}


def tree_cost(model, drafter, prompt: list[int], spec: TreeSpec, repeats: int, warmup: bool = True) -> float:
    """Median ms to verify a ``spec`` tree drafted after ``prompt`` and keep its deepest path (to the
    first drafted of its deepest nodes): one forward of the tree rows and the cut afterwards (on
    llama.cpp a tree is decoded as chains, so its cost is not the cost of W + 1 chain rows)."""
    tree = draft_step(drafter, prompt, spec, Sampler(0.0))
    path = tree.path(max(range(len(tree) + 1), key=lambda n: (tree.depths[n], -n)))  # deepest, first drafted
    base = len(prompt) - 1
    cache = model.new_cache(len(prompt) + len(tree) + 8)

    def verify(_: int) -> None:
        model.forward(torch.tensor(tree.tokens), tree.position_ids(base), tree.attention_mask(base), cache)
        cache.keep(list(range(base)) + [base] + [base + n for n in path])

    with torch.inference_mode():
        model.forward(torch.tensor(prompt[:-1]), torch.arange(base), None, cache, logits_rows=None)
        return median_ms(verify, repeats, lambda: cache.truncate(base), warmup)


def draft_time(target, drafter, prompt: list[int], spec: TreeSpec, repeats: int) -> float:
    """Median ms to draft one ``spec`` after ``prompt`` (a new last token each time, as in decoding; after
    a warm-up run, which also fills the draft's cache with the prompt)."""
    return median_ms(lambda r: draft_step(drafter, prompt + [(3000 + r) % target.vocab_size], spec, Sampler(0.0)),
                     repeats)


# -- acceptance -----------------------------------------------------------------------------------


def accepted_per_round(target, drafter, prompts: list[list[int]], config) -> list[int]:
    """Drafted tokens accepted in each verification round of ``config`` over the calibration prompts."""
    return [a for ids in prompts for a in generate_all(target, ids, config, drafter).stats.accepted]


def chain_taus(accepted: Sequence[int], max_gamma: int) -> dict[int, float]:
    """τ(γ) for γ = 1..max_gamma from the rounds of one greedy sd run at γ = max_gamma.

    A greedy draft proposes the same chain whatever γ is, so a round that accepted a of max_gamma
    tokens would have accepted min(a, γ) of γ: τ(γ) = 1 + mean(min(a, γ)) over the rounds (the rounds
    start where the max_gamma run's did, which only changes which positions are sampled).
    """
    return {gamma: mean_tau([min(a, gamma) for a in accepted], empty=1.0) for gamma in range(1, max_gamma + 1)}


def sd_taus(target, drafter, prompts: list[list[int]], calibration: Calibration) -> dict[int, float]:
    """τ of sd for γ = 1..max_gamma: one run per γ, or all of them from one run (``tau_per_gamma``)."""
    def run(gamma: int) -> list[int]:
        return accepted_per_round(target, drafter, prompts, preset("sd", gamma=gamma, max_new_tokens=calibration.tokens))

    if not calibration.tau_per_gamma:
        return chain_taus(run(calibration.max_gamma), calibration.max_gamma)
    return {gamma: mean_tau(run(gamma), empty=1.0) for gamma in range(1, calibration.max_gamma + 1)}


def tree_tau(target, drafter, prompts: list[list[int]], spec: TreeSpec, tokens: int) -> float:
    config = preset("tree", tree_depth=spec.depth, tree_branch=spec.branch, tree_expand=spec.expand,
                    tree_width=spec.width, max_new_tokens=tokens)
    return mean_tau(accepted_per_round(target, drafter, prompts, config), empty=1.0)


def measure_draft(draft: DraftSubject, target, prompts: list[list[int]], calibration: Calibration,
                  taus: DraftMeasure | None = None) -> DraftMeasure:
    """A draft's ms per token (chains of 4), τ of sd per γ, and τ and draft time of each tree shape;
    ``taus``: take τ from this measure instead of measuring it (``shared_tau``)."""
    drafter, repeats = draft.drafter, calibration.repeats
    ms = draft_time(target, drafter, prompts[0], TreeSpec.chain(4), repeats) / 4
    tau = dict(taus.tau) if taus else sd_taus(target, drafter, prompts, calibration)
    shared = {t.spec: t.tau for t in taus.trees} if taus else {}
    trees = [TreeMeasure(spec, shared[spec] if spec in shared else tree_tau(target, drafter, prompts, spec,
                                                                            calibration.tokens),
                         draft_time(target, drafter, prompts[0], spec, repeats))
             for spec in calibration.trees]
    return DraftMeasure(draft.backend, draft.description, ms, tau, trees)


# -- the whole device -----------------------------------------------------------------------------


class Progress:
    """Says each phase with the seconds elapsed since the start, through ``say`` (a logger's method)."""

    def __init__(self, say: Callable[[str], object]) -> None:
        self.say = say
        self.start = time.monotonic()

    def __call__(self, phase: str) -> None:
        self.say(f"[{self.elapsed():5.1f} s] {phase}")

    def elapsed(self) -> float:
        return time.monotonic() - self.start


def calibrate(model: str | os.PathLike | None = None, threads: int | None = None, llama_cpp: bool = True,
              calibration: Calibration = FULL, say: Callable[[str], object] = lambda line: None) -> dict:
    """Load (:func:`load_subjects`), measure (:func:`measure_device`) and free what is measured; the plan
    record. ``say`` gets one line per phase with the seconds elapsed since the start."""
    progress = Progress(say)
    progress("loading the target and the drafts ...")
    subjects = load_subjects(model, threads, llama_cpp)
    try:
        for skipped in subjects.skipped:
            progress(f"not measured: {skipped}")
        return measure_device(subjects, calibration, progress)
    finally:
        subjects.close()


def measure_device(subjects: Subjects, calibration: Calibration = FULL, progress: Progress | None = None) -> dict:
    """Measure every backend and draft of ``subjects``; the plan record (the fastest candidate chosen,
    every measurement kept). ``progress`` says each phase (default: nothing)."""
    progress = progress or Progress(lambda line: None)
    target, cal = subjects.target, calibration
    prompts = [chat_prompt(target.tokenizer, p) for p in CALIBRATION_PROMPTS[: cal.prompts]]
    tree_drafter = subjects.drafts[0].drafter if subjects.drafts else None
    costs: dict[str, dict[int, float]] = {}
    tree_costs: dict[str, dict[int, float]] = {}
    for backend, lm in subjects.backends.items():
        progress(f"measuring the {backend} backend: rows {', '.join(map(str, cal.rows))} x{cal.repeats} ...")
        costs[backend] = row_costs(lm, cal.rows, cal.repeats, warmup=cal.warmup)
        if tree_drafter is not None:
            progress(f"measuring the {backend} backend: verifying {len(cal.trees)} tree shape(s) ...")
            tree_costs[backend] = {spec.width: tree_cost(lm, tree_drafter, prompts[0], spec, cal.repeats, cal.warmup)
                                   for spec in cal.trees}
    measured: list[DraftMeasure] = []
    for draft in subjects.drafts:
        shared = measured[0] if cal.shared_tau and measured else None
        what = "its cost (τ shared with the " + shared.backend + " draft)" if shared else "its cost and acceptance"
        progress(f"measuring the {draft.backend} draft: {what} ...")
        measured.append(measure_draft(draft, target, prompts, cal, shared))
    scored = choose(costs, measured, tree_costs)
    progress(f"measured in {progress.elapsed():.1f} s")
    return device_record(subjects, cal, costs, tree_costs, measured, scored, progress.elapsed())


def device_record(subjects: Subjects, cal: Calibration, costs: dict, tree_costs: dict,
                  measured: Sequence[DraftMeasure], scored: dict, seconds: float) -> dict:
    """The plan record of a measurement (schema: :mod:`.device_plan`; the measurements beside it)."""
    choice = scored["choice"]
    cheapest = min(measured, key=lambda d: d.ms_per_token).backend if measured else "torch"
    notes = ["predicted tokens/s: ar = 1000 / cost(1); sd = 1000 tau(g) / (cost(g + 1) + g draft_ms); "
             "tree of W nodes = 1000 tau(tree) / (tree cost(W) + tree draft_ms)",
             f"row costs: median ms to evaluate n rows after a {PREFIX}-token prefix, logits for every row",
             "tree costs: median ms to verify a drafted tree of W nodes and keep its deepest path",
             "tau: greedy, each draft on the torch target, over the calibration prompts",
             "draft_backend: the chosen candidate's draft, else the draft cheapest per token"]
    if not cal.tau_per_gamma:
        notes.append(f"tau(g) for g = 1..{cal.max_gamma}: from one sd run at g = {cal.max_gamma} (1 + mean min(a, g))")
    if cal.shared_tau and len(measured) > 1:
        notes.append(f"tau of the drafts after the first: the {measured[0].backend} draft's (the same draft)")
    notes.extend(f"skipped {s}" for s in subjects.skipped)
    return plan_record(
        choice,
        model=subjects.model,
        threads=subjects.threads,
        draft_backend=choice["draft_backend"] or cheapest,
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        machine=this_machine(),
        calibration={"name": cal.name, "seconds": round(seconds, 1)},
        row_costs_ms={b: {str(n): c for n, c in cost.items()} for b, cost in costs.items()},
        tree_costs_ms={b: {str(w): c for w, c in cost.items()} for b, cost in tree_costs.items()},
        drafts=[d.record() for d in measured],
        candidates=scored["candidates"],
        notes=notes,
    )


# -- one measuring request (planner_node's `profile` service) ---------------------------------------


@dataclass
class ProfileResult:
    """What ``profile`` measured: the target's cost per row count, the draft's per token, τ per γ."""

    device: str
    token_counts: list[int]
    latency_ms: list[float]
    draft_ms_per_token: float
    gammas: list[int]
    tau: list[float]


PROFILE_GAMMAS = 4
MAX_PROFILE_ROWS = 64


def profile(subjects: Subjects, backend: str, draft_backend: str, prefix: int, token_counts: Sequence[int],
            quick: bool) -> ProfileResult:
    """Time ``token_counts`` rows after a ``prefix``-token prefix on ``backend``, the ``draft_backend``
    draft per token, and τ of sd for γ = 1..4 (``quick``: FAST's repeats and tokens, one sd run for
    every γ; else FULL's, one sd run per γ). ValueError for a backend or sizes this device cannot do."""
    if backend not in subjects.backends:
        raise ValueError(f"backend {backend!r} is not available here (available: {', '.join(subjects.backends)})")
    lm = subjects.backends[backend]
    if not token_counts or min(token_counts) < 1 or max(token_counts) > MAX_PROFILE_ROWS:
        raise ValueError(f"token_counts must be between 1 and {MAX_PROFILE_ROWS}, got {list(token_counts)}")
    if prefix < 1 or prefix + max(token_counts) + 8 > lm.max_context:
        raise ValueError(f"prefix_len {prefix} + {max(token_counts)} rows exceeds the {backend} context of "
                         f"{lm.max_context} tokens")
    cal = dataclasses.replace(FAST if quick else FULL, max_gamma=PROFILE_GAMMAS, trees=())
    costs = row_costs(lm, sorted(set(token_counts)), cal.repeats, prefix)
    drafts = [d for d in subjects.drafts if d.backend == draft_backend] or subjects.drafts
    ms, tau = 0.0, {}
    if drafts:
        prompts = [chat_prompt(subjects.target.tokenizer, p) for p in CALIBRATION_PROMPTS[: cal.prompts]]
        measured = measure_draft(drafts[0], subjects.target, prompts, cal)
        ms, tau = measured.ms_per_token, measured.tau
    device = f"{cpu_name()}, {subjects.threads} threads, {backend}"
    if drafts:
        device += f", draft on {drafts[0].backend}"
    return ProfileResult(device, list(token_counts), [costs[n] for n in token_counts], ms, list(tau), list(tau.values()))
