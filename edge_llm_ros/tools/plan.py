"""``edge-llm-ros plan --device``: measure this machine, pick the decoding mode, γ and backend.

    edge-llm-ros plan --device                 # measure, print the table, save ~/.config/edge_llm_ros/plan.json
    edge-llm-ros plan --device --quick --out plan.json

What it measures (Ghidorah §III-C: the verification width that pays depends on the hardware):

* the target's cost of evaluating n rows after a 240-token prefix, n = 1..MAX_ROWS, on each backend
  (torch; llama.cpp when llama-cpp-python is installed);
* the draft's cost per drafted token (the shipped draft, a chain of γ = 4);
* τ(γ), tokens per verification of ``sd`` at γ = 1..MAX_GAMMA, on a fixed calibration prompt set
  (greedy; τ depends on the draft and target, not on the backend).

Each candidate is scored by its predicted speed, ``ar``: 1 / cost(1); ``sd`` at γ:
τ(γ) / (cost(γ + 1) + γ · draft step), and the fastest is chosen. Where no γ beats ``ar``, ``ar`` is the
plan. The JSON keeps every measurement, so a plan can be checked against ``bench``.
Trees are not candidates yet (the llama.cpp backend verifies chains only).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import TextIO

import torch

from edge_llm_ros.core import chat_prompt, generate_all, preset

from .generate import Parser, one_line
from .loading import ToolError, build_drafter, load_target, set_threads

PREFIX = 240
MAX_ROWS, MAX_GAMMA = 8, 6
REPEATS, QUICK_REPEATS = 5, 3
CALIBRATION_PROMPTS = (
    "Go to the kitchen and tell me what is on the table.",
    "Explain how a robot vacuum cleaner maps a room.",
    "Write a Python function that checks whether a number is prime.",
)
CALIBRATION_TOKENS, QUICK_TOKENS = 48, 16


def default_plan_path() -> Path:
    root = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
    return root / "edge_llm_ros" / "plan.json"


def row_costs(model, rows: range, repeats: int) -> dict[int, float]:
    """Median ms to evaluate n rows (logits for each) after a PREFIX-token prefix, per n."""
    cache = model.new_cache(PREFIX + max(rows) + 8)
    prefix = [(1000 + 7 * i) % model.vocab_size for i in range(PREFIX)]
    with torch.inference_mode():
        model.forward(torch.tensor(prefix), torch.arange(PREFIX), None, cache, logits_rows=None)
        costs = {}
        for n in rows:
            times = []
            for r in range(repeats + 1):  # the first one warms up
                ids = torch.tensor([(2000 + 13 * (i + r)) % model.vocab_size for i in range(n)])
                start = time.perf_counter()
                model.forward(ids, torch.arange(PREFIX, PREFIX + n), None, cache)
                times.append(time.perf_counter() - start)
                cache.truncate(PREFIX)
            costs[n] = 1000 * sorted(times[1:])[len(times[1:]) // 2]
    return costs


def draft_cost(target, drafter, prompt: list[int], repeats: int) -> float:
    """ms per drafted token for chains of 4."""
    from edge_llm_ros.core.decoding import draft_step
    from edge_llm_ros.core.drafters import TreeSpec
    from edge_llm_ros.core.sampling import Sampler

    times = []
    for r in range(repeats + 1):
        start = time.perf_counter()
        draft_step(drafter, prompt + [(3000 + r) % target.vocab_size], TreeSpec.chain(4), Sampler(0.0))
        times.append(time.perf_counter() - start)
    return 1000 * sorted(times[1:])[len(times[1:]) // 2] / 4


def taus(target, drafter, prompts: list[list[int]], tokens: int) -> dict[int, float]:
    """τ of sd at each γ over the calibration prompts (greedy)."""
    out = {}
    for gamma in range(1, MAX_GAMMA + 1):
        accepted = rounds = 0
        for ids in prompts:
            stats = generate_all(target, ids, preset("sd", gamma=gamma, max_new_tokens=tokens), drafter).stats
            accepted, rounds = accepted + sum(stats.accepted), rounds + stats.rounds
        out[gamma] = (accepted + rounds) / rounds if rounds else 1.0
    return out


def choose(costs: dict[str, dict[int, float]], tau: dict[int, float], draft_ms: float | None) -> dict:
    """Predicted tokens/s of every (backend, mode, γ) candidate, and the fastest."""
    candidates = []
    for backend, cost in costs.items():
        candidates.append({"backend": backend, "mode": "ar", "gamma": 0, "tokens_per_s": 1000 / cost[1]})
        if draft_ms is None:
            continue
        for gamma, t in tau.items():
            if gamma + 1 in cost:
                ms = cost[gamma + 1] + gamma * draft_ms
                candidates.append({"backend": backend, "mode": "sd", "gamma": gamma, "tokens_per_s": 1000 * t / ms})
    best = max(candidates, key=lambda c: c["tokens_per_s"])
    return {"choice": best, "candidates": sorted(candidates, key=lambda c: -c["tokens_per_s"])}


def measure(threads: int, quick: bool, progress: TextIO) -> dict:
    from edge_llm_ros.core.llama_backend import llama_cpp_available, load_llama_cpp

    repeats = QUICK_REPEATS if quick else REPEATS
    rows = range(1, MAX_ROWS + 1)
    target = load_target(None)
    costs: dict[str, dict[int, float]] = {}
    print("measuring the torch backend ...", file=progress, flush=True)
    costs["torch"] = row_costs(target, rows, repeats)
    if llama_cpp_available():
        print("measuring the llama.cpp backend ...", file=progress, flush=True)
        lm = load_llama_cpp(n_threads=threads, tokenizer=target.tokenizer)
        try:
            costs["llama.cpp"] = row_costs(lm, rows, repeats)
        finally:
            lm.close()
    print("measuring the draft and its acceptance ...", file=progress, flush=True)
    draft = build_drafter(None, target)
    prompts = [chat_prompt(target.tokenizer, p) for p in CALIBRATION_PROMPTS[: 1 if quick else None]]
    draft_ms = draft_cost(target, draft.drafter, prompts[0], repeats)
    tau = taus(target, draft.drafter, prompts, QUICK_TOKENS if quick else CALIBRATION_TOKENS)
    plan = choose(costs, tau, draft_ms)
    plan.update(
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        machine={"cpu_count": os.cpu_count(), "threads": threads, "platform": platform.platform()},
        row_costs_ms={b: {str(n): c for n, c in cost.items()} for b, cost in costs.items()},
        draft={"description": draft.description, "ms_per_token": draft_ms},
        tau={str(g): t for g, t in tau.items()},
        notes=["predicted tokens/s: ar = 1000 / cost(1); sd = 1000 tau(g) / (cost(g + 1) + g draft_ms)",
               f"row costs: median ms to evaluate n rows after a {PREFIX}-token prefix, logits for every row"],
    )
    return plan


def format_plan(plan: dict) -> str:
    lines = [f"{'rows':>5}" + "".join(f"{b + ' ms':>14}" for b in plan["row_costs_ms"])]
    for n in next(iter(plan["row_costs_ms"].values())):
        lines.append(f"{n:>5}" + "".join(f"{cost[n]:>14.1f}" for cost in plan["row_costs_ms"].values()))
    lines.append(f"draft: {plan['draft']['description']}, {plan['draft']['ms_per_token']:.1f} ms per token")
    lines.append("tau(gamma): " + ", ".join(f"{g}: {t:.2f}" for g, t in plan["tau"].items()))
    lines.append("")
    lines.append(f"{'backend':<11}{'mode':<6}{'gamma':>6}{'pred tok/s':>12}")
    for c in plan["candidates"][:8]:
        lines.append(f"{c['backend']:<11}{c['mode']:<6}{c['gamma']:>6}{c['tokens_per_s']:>12.1f}")
    best = plan["choice"]
    lines.append("")
    lines.append(f"plan: mode {best['mode']}" + (f", gamma {best['gamma']}" if best["mode"] == "sd" else "")
                 + f", backend {best['backend']} (predicted {best['tokens_per_s']:.1f} tokens/s)")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="edge-llm-ros plan", description="Measure this device and pick mode, gamma and backend.")
    p.add_argument("--device", action="store_true", required=True, help="calibrate on this machine")
    p.add_argument("--out", default=None, metavar="FILE", help=f"where to save the plan (default {default_plan_path()})")
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
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(plan, indent=2) + "\n")
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
