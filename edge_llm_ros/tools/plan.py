"""``edge-llm-ros plan --device``: measure this machine, pick the decoding mode, its shape and the backend.

    edge-llm-ros plan --device                 # measure, print the table, save ~/.config/edge_llm_ros/plan.json
    edge-llm-ros plan --device --quick --out plan.json

What it measures (Ghidorah §III-C: the verification width that pays depends on the hardware):

* on each backend (torch; llama.cpp when llama-cpp-python is installed), the target's cost of
  evaluating n chain rows after a 240-token prefix (ROWS: 1-8, then up to 32 for the curve), and of verifying a drafted
  tree of each of TREE_SHAPES (llama.cpp decodes a tree as chains, so that is not cost(W + 1));
* each drafter (the shipped draft on torch; its GGUF on llama.cpp): ms per drafted token for a
  chain of γ = 4 and per whole tree for each of TREE_SHAPES, and τ, tokens per verification, of
  ``sd`` at γ = 1..MAX_GAMMA and of ``tree`` for each shape, on a fixed calibration prompt set
  (greedy, on the torch target: τ depends on the draft and target, not on the target's backend).

Each (backend, mode, shape, draft) candidate is scored by its predicted speed, ``ar``: 1 / cost(1);
``sd`` at γ: τ(γ) / (cost(γ + 1) + γ · draft step); ``tree`` of W nodes: τ(tree) / (tree cost(W) +
its draft time). The fastest is chosen; where no draft shape beats ``ar``, ``ar`` is the plan. The
file (schema: :mod:`edge_llm_ros.core.device_plan`) keeps every measurement, so a plan can be
checked against ``bench``; ``generate`` and draft_node use it by default.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import torch

from edge_llm_ros.core import PRESETS, TreeSpec, chat_prompt, default_model_path, generate_all, preset
from edge_llm_ros.core.device_plan import (
    PLAN_ENV,
    candidate,
    default_plan_path,
    plan_record,
    save_plan,
    shape_text,
    tree_record,
)

from .generate import Parser, one_line
from .loading import LLAMA_CPP, ToolError, build_drafter, load_target, set_threads

PREFIX = 240
MAX_GAMMA = 6
# Rows whose cost is measured: 1-8 score the candidates (sd up to MAX_GAMMA + 1 rows, trees up to 8),
# the rest show how the cost grows; --quick measures fewer of them.
ROWS, QUICK_ROWS = (*range(1, 9), 12, 16, 24, 32), (*range(1, 9), 16, 32)
# Trees verified within 8 rows (root + W nodes); the last is the ``tree`` preset.
TREE_SHAPES = (TreeSpec(depth=3, branch=2, expand=2, width=4), TreeSpec(depth=4, branch=2, expand=2, width=6),
               PRESETS["tree"].tree_spec())
REPEATS, QUICK_REPEATS = 5, 3
CALIBRATION_PROMPTS = (
    "Go to the kitchen and tell me what is on the table.",
    "Explain how a robot vacuum cleaner maps a room.",
    "Write a Python function that checks whether a number is prime.",
)
CALIBRATION_TOKENS, QUICK_TOKENS = 48, 16


@dataclass(frozen=True)
class TreeMeasure:
    """One tree shape as measured: τ per verification and ms to draft the whole tree."""

    spec: TreeSpec
    tau: float
    draft_ms: float


@dataclass(frozen=True)
class DraftMeasure:
    """One drafter as measured: where it runs, its ms per drafted token, τ of sd per γ, its trees."""

    backend: str
    description: str
    ms_per_token: float
    tau: dict[int, float]
    trees: Sequence[TreeMeasure] = ()


def median_ms(step: Callable[[int], object], repeats: int, after: Callable[[], object] = lambda: None) -> float:
    """Median ms of ``step(r)`` over ``repeats`` runs after one warm-up run; ``after()`` runs untimed
    after each (resetting a cache)."""
    times = []
    for r in range(repeats + 1):
        start = time.perf_counter()
        step(r)
        times.append(time.perf_counter() - start)
        after()
    return 1000 * sorted(times[1:])[len(times[1:]) // 2]


def row_costs(model, rows: Sequence[int], repeats: int) -> dict[int, float]:
    """Median ms to evaluate n rows (logits for each) after a PREFIX-token prefix, per n."""
    cache = model.new_cache(PREFIX + max(rows) + 8)
    prefix = [(1000 + 7 * i) % model.vocab_size for i in range(PREFIX)]

    def evaluate(n: int, r: int) -> None:
        ids = torch.tensor([(2000 + 13 * (i + r)) % model.vocab_size for i in range(n)])
        model.forward(ids, torch.arange(PREFIX, PREFIX + n), None, cache)

    with torch.inference_mode():
        model.forward(torch.tensor(prefix), torch.arange(PREFIX), None, cache, logits_rows=None)
        return {n: median_ms(lambda r, n=n: evaluate(n, r), repeats, lambda: cache.truncate(PREFIX)) for n in rows}


def tree_cost(model, drafter, prompt: list[int], spec: TreeSpec, repeats: int) -> float:
    """Median ms to verify a ``spec`` tree drafted after ``prompt`` and keep its deepest path (to the
    first drafted of its deepest nodes): one forward of the tree rows and the cut afterwards (on
    llama.cpp a tree is decoded as chains, so its cost is not the cost of W + 1 chain rows)."""
    from edge_llm_ros.core.decoding import draft_step
    from edge_llm_ros.core.sampling import Sampler

    tree = draft_step(drafter, prompt, spec, Sampler(0.0))
    path = tree.path(max(range(len(tree) + 1), key=lambda n: (tree.depths[n], -n)))  # deepest, first drafted
    base = len(prompt) - 1
    cache = model.new_cache(len(prompt) + len(tree) + 8)

    def verify(_: int) -> None:
        model.forward(torch.tensor(tree.tokens), tree.position_ids(base), tree.attention_mask(base), cache)
        cache.keep(list(range(base)) + [base] + [base + n for n in path])

    with torch.inference_mode():
        model.forward(torch.tensor(prompt[:-1]), torch.arange(base), None, cache, logits_rows=None)
        return median_ms(verify, repeats, lambda: cache.truncate(base))


def draft_time(target, drafter, prompt: list[int], spec: TreeSpec, repeats: int) -> float:
    """Median ms to draft one ``spec`` after ``prompt`` (a new last token each time, as in decoding)."""
    from edge_llm_ros.core.decoding import draft_step
    from edge_llm_ros.core.sampling import Sampler

    return median_ms(lambda r: draft_step(drafter, prompt + [(3000 + r) % target.vocab_size], spec, Sampler(0.0)),
                     repeats)


def mean_tau(target, drafter, prompts: list[list[int]], config) -> float:
    """Tokens per verification of ``config`` over the calibration prompts."""
    accepted = rounds = 0
    for ids in prompts:
        stats = generate_all(target, ids, config, drafter).stats
        accepted, rounds = accepted + sum(stats.accepted), rounds + stats.rounds
    return (accepted + rounds) / rounds if rounds else 1.0


def measure_draft(backend: str, draft, target, prompts: list[list[int]], tokens: int, repeats: int) -> DraftMeasure:
    """A drafter's cost per token (chains of 4), τ of sd at each γ and τ and draft time of each of
    TREE_SHAPES (greedy, on the torch target: τ depends on the draft and target, not the backend)."""
    drafter = draft.drafter
    ms = draft_time(target, drafter, prompts[0], TreeSpec.chain(4), repeats) / 4
    tau = {gamma: mean_tau(target, drafter, prompts, preset("sd", gamma=gamma, max_new_tokens=tokens))
           for gamma in range(1, MAX_GAMMA + 1)}
    trees = []
    for spec in TREE_SHAPES:
        config = preset("tree", tree_depth=spec.depth, tree_branch=spec.branch, tree_expand=spec.expand,
                        tree_width=spec.width, max_new_tokens=tokens)
        trees.append(TreeMeasure(spec, mean_tau(target, drafter, prompts, config),
                                 draft_time(target, drafter, prompts[0], spec, repeats)))
    return DraftMeasure(backend, draft.description, ms, tau, trees)


def choose(costs: dict[str, dict[int, float]], drafts: Sequence[DraftMeasure],
           tree_costs: dict[str, dict[int, float]] | None = None) -> dict:
    """Predicted tokens/s of every (backend, mode, shape, draft) candidate, and the fastest.

    ``costs[backend][n]``: ms to evaluate n chain rows; ``tree_costs[backend][W]``: ms to verify a
    tree of W nodes (default ``costs[backend][W + 1]``).
    """
    candidates = []
    for backend, cost in costs.items():
        candidates.append(candidate(backend, "ar", 1000 / cost[1]))
        for d in drafts:
            for gamma, t in d.tau.items():
                if gamma + 1 in cost:
                    ms = cost[gamma + 1] + gamma * d.ms_per_token
                    candidates.append(candidate(backend, "sd", 1000 * t / ms, gamma=gamma, draft_backend=d.backend))
            for tree in d.trees:
                verify = (tree_costs or {}).get(backend, {}).get(tree.spec.width, cost.get(tree.spec.width + 1))
                if verify is not None:
                    candidates.append(candidate(backend, "tree", 1000 * tree.tau / (verify + tree.draft_ms),
                                                tree=tree.spec, draft_backend=d.backend))
    best = max(candidates, key=lambda c: c["tokens_per_s"])
    return {"choice": best, "candidates": sorted(candidates, key=lambda c: -c["tokens_per_s"])}


def measure(threads: int, quick: bool, progress: TextIO) -> dict:
    """Measure everything; the plan's JSON object (:func:`~edge_llm_ros.core.device_plan.plan_record`)."""
    from edge_llm_ros.core.llama_backend import llama_cpp_available, load_llama_cpp

    repeats = QUICK_REPEATS if quick else REPEATS
    rows = QUICK_ROWS if quick else ROWS
    model = default_model_path().resolve()
    target = load_target(None)
    prompts = [chat_prompt(target.tokenizer, p) for p in CALIBRATION_PROMPTS[: 1 if quick else None]]
    tokens = QUICK_TOKENS if quick else CALIBRATION_TOKENS
    drafts = [("torch", build_drafter(None, target))]
    if llama_cpp_available():
        drafts.append((LLAMA_CPP, build_drafter(LLAMA_CPP, target, threads=threads)))
    costs: dict[str, dict[int, float]] = {}
    tree_costs: dict[str, dict[int, float]] = {}
    backends = [("torch", target)]
    if llama_cpp_available():
        backends.append((LLAMA_CPP, load_llama_cpp(model, n_threads=threads, tokenizer=target.tokenizer)))
    for backend, lm in backends:
        print(f"measuring the {backend} backend ...", file=progress, flush=True)
        costs[backend] = row_costs(lm, rows, repeats)
        tree_costs[backend] = {spec.width: tree_cost(lm, drafts[0][1].drafter, prompts[0], spec, repeats)
                               for spec in TREE_SHAPES}
        if lm is not target:
            lm.close()
    measured = []
    for backend, draft in drafts:
        print(f"measuring the {backend} draft and its acceptance ...", file=progress, flush=True)
        measured.append(measure_draft(backend, draft, target, prompts, tokens, repeats))
    scored = choose(costs, measured, tree_costs)
    choice = scored["choice"]
    cheapest = min(measured, key=lambda d: d.ms_per_token).backend
    return plan_record(
        choice,
        model=model,
        threads=threads,
        draft_backend=choice["draft_backend"] or cheapest,
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        machine={"cpu_count": os.cpu_count(), "platform": platform.platform()},
        row_costs_ms={b: {str(n): c for n, c in cost.items()} for b, cost in costs.items()},
        tree_costs_ms={b: {str(w): c for w, c in cost.items()} for b, cost in tree_costs.items()},
        drafts=[{"backend": d.backend, "description": d.description, "ms_per_token": d.ms_per_token,
                 "tau": {str(g): t for g, t in d.tau.items()},
                 "trees": [{"tree": tree_record(m.spec), "tau": m.tau, "draft_ms": m.draft_ms} for m in d.trees]}
                for d in measured],
        candidates=scored["candidates"],
        notes=["predicted tokens/s: ar = 1000 / cost(1); sd = 1000 tau(g) / (cost(g + 1) + g draft_ms); "
               "tree of W nodes = 1000 tau(tree) / (tree cost(W) + tree draft_ms)",
               f"row costs: median ms to evaluate n rows after a {PREFIX}-token prefix, logits for every row",
               "tree costs: median ms to verify a drafted tree of W nodes and keep its deepest path",
               "tau: greedy, each draft on the torch target, over the calibration prompts",
               "draft_backend: the chosen candidate's draft, else the draft cheapest per token"],
    )


def candidate_shape(c: dict) -> str:
    """``γ=2`` / ``W=7 depth 4`` / '' of a candidate as the file keeps it."""
    return shape_text(c["mode"], c["gamma"], TreeSpec(**c["tree"]) if c.get("tree") else None)


def format_plan(plan: dict) -> str:
    costs, trees = plan["row_costs_ms"], plan["tree_costs_ms"]
    lines = [f"{'rows':>5}" + "".join(f"{b + ' ms':>14}" for b in costs)]
    for n in next(iter(costs.values())):
        lines.append(f"{n:>5}" + "".join(f"{cost[n]:>14.1f}" for cost in costs.values()))
    for w in next(iter(trees.values())):
        lines.append(f"{'W=' + w:>5}" + "".join(f"{cost[w]:>14.1f}" for cost in trees.values()) + "   (tree)")
    for d in plan["drafts"]:
        lines.append(f"draft on {d['backend']}: {d['description']}, {d['ms_per_token']:.1f} ms per token")
        lines.append("  tau(gamma): " + ", ".join(f"{g}: {t:.2f}" for g, t in d["tau"].items()))
        lines.append("  tau(tree): " + ", ".join(
            f"{shape_text('tree', tree=TreeSpec(**t['tree']))}: {t['tau']:.2f} (draft {t['draft_ms']:.0f} ms)"
            for t in d["trees"]))
    lines.append("")
    lines.append(f"{'backend':<11}{'mode':<6}{'shape':<14}{'draft':<11}{'pred tok/s':>12}")
    for c in plan["candidates"][:10]:
        lines.append(f"{c['backend']:<11}{c['mode']:<6}{candidate_shape(c):<14}{c['draft_backend'] or '-':<11}"
                     f"{c['tokens_per_s']:>12.1f}")
    best = plan["choice"]
    shape = candidate_shape(best)
    lines.append("")
    lines.append(f"plan: mode {best['mode']}" + (f", {shape}" if shape else "")
                 + f", backend {best['backend']}, draft on {plan['draft_backend']}"
                 + f" (predicted {best['tokens_per_s']:.1f} tokens/s)")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="edge-llm-ros plan", description="Measure this device and pick mode, draft shape and backend.")
    p.add_argument("--device", action="store_true", required=True, help="calibrate on this machine")
    p.add_argument("--out", default=None, metavar="FILE",
                   help=f"where to save the plan (default {default_plan_path()}, ${PLAN_ENV} moves it)")
    p.add_argument("--threads", type=int, default=None, help="threads for both backends (default: every core)")
    p.add_argument("--quick", action="store_true", help="fewer repeats and one calibration prompt")
    return p


def main(argv: list[str] | None = None, out: TextIO | None = None, err: TextIO | None = None) -> int:
    out = sys.stdout if out is None else out
    err = sys.stderr if err is None else err
    try:
        args = build_parser().parse_args(argv)
        path = Path(args.out) if args.out else default_plan_path()
        threads = set_threads(args.threads)
        plan = measure(threads, args.quick, err)
        save_plan(plan, path)
    except ToolError as exc:
        print(f"error: {one_line(exc)}", file=err, flush=True)
        return 2
    except OSError as exc:
        print(f"error: cannot write the plan: {exc}", file=err, flush=True)
        return 2
    except SystemExit as exc:
        return int(exc.code or 0)
    print(format_plan(plan), file=out, flush=True)
    print(f"wrote {path}", file=err, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
