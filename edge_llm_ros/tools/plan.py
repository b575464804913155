"""``edge-llm-ros plan``: measure this machine and pick the decoding mode, its shape and the backend
(``--device``), or plan a stage pipeline over devices (``--pipeline``).

    edge-llm-ros plan --device                 # measure, print the table, save ~/.config/edge_llm_ros/plan.json
    edge-llm-ros plan --device --quick --out plan.json
    edge-llm-ros plan --pipeline [--devices config/devices.example.yaml] [--prompt-len 128] [--out plan.yaml]

What it measures and how candidates are scored is core's (:mod:`edge_llm_ros.core.planning.device_profile`,
:mod:`edge_llm_ros.core.planning.planner`), the same code planner_node measures and plans with: on each
backend (torch; llama.cpp when llama-cpp-python is installed) the target's cost of n chain rows
after a 240-token prefix (1-8, then up to 32 for the curve) and of verifying each of TREE_SHAPES;
per drafter (the shipped draft on torch, its GGUF on llama.cpp) ms per drafted token and per tree,
and τ of ``sd`` at γ = 1..MAX_GAMMA and of ``tree`` per shape (greedy, on the torch target).

Each (backend, mode, shape, draft) candidate is scored by its predicted speed, ``ar``: 1 / cost(1);
``sd`` at γ: τ(γ) / (cost(γ + 1) + γ · draft step); ``tree`` of W nodes: τ(tree) / (tree cost(W) +
its draft time). The fastest is chosen; where no draft shape beats ``ar``, ``ar`` is the plan. The
file (schema: :mod:`edge_llm_ros.core.planning.device_plan`) keeps every measurement, so a plan can be
checked against ``bench`` and planner_node can plan deployments from it; ``generate`` and
draft_node use it by default. ``--quick`` measures fewer rows, repeats and tokens (core's QUICK).

``--pipeline`` (core's :mod:`~edge_llm_ros.core.planning.pipeline_plan`, the same code planner_node's
``plan`` service runs for deployment ``pipeline``): over the devices of ``--devices`` (default:
this machine's two cores, one thread each, available memory / 2 each, an emulated 1 Gbit/s 1 ms
link), Jupiter's layer split, the prompt's prefill chunks, FlowSpec's segment and segments in
flight, and the predicted tokens/s of ar, chunk_pp and flowspec with why. Devices measured here
(``profile:``, and the default) use a layer profile measured once (a few seconds, a line per row
count) and saved next to the device plan. τ: the devices file's, else the saved device plan's
(measured by ``--device``), else an assumption the table names. A device whose budget cannot hold
its share is refused (exit 2) before anything is measured. It prints the table, writes the plan
as a ROS 2 params file layered over config/stages.yaml (default
~/.config/edge_llm_ros/pipeline_plan.yaml) and the launch command that runs it.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import TextIO

from edge_llm_ros.core.drafts.loading import LoadError, set_threads
from edge_llm_ros.core.engine.drafters import TreeSpec
from edge_llm_ros.core.planning.device_plan import PLAN_ENV, default_plan_path, save_plan, shape_text
from edge_llm_ros.core.planning.device_profile import FULL, QUICK, TREE_SHAPES, calibrate
from edge_llm_ros.core.planning.partition import PartitionError
from edge_llm_ros.core.planning.pipeline_plan import (
    GHIDORAH,
    AcceptanceCurve,
    PlanRequest,
    default_devices,
    model_shape,
    plan_pipeline,
    read_devices,
    saved_profile,
)
from edge_llm_ros.core.planning.planner import DraftMeasure, TreeMeasure, choose
from edge_llm_ros.tools.generate import Parser, one_line
from edge_llm_ros.tools.loading import ToolError

__all__ = ["DraftMeasure", "MAX_GAMMA", "QUICK_ROWS", "ROWS", "TREE_SHAPES", "TreeMeasure", "choose", "main",
           "measure"]

ROWS, QUICK_ROWS = FULL.rows, QUICK.rows
MAX_GAMMA = FULL.max_gamma


def measure(threads: int, quick: bool, progress: TextIO) -> dict:
    """Measure everything; the plan's JSON object (:func:`~edge_llm_ros.core.planning.device_plan.plan_record`)."""
    try:
        return calibrate(None, threads, calibration=QUICK if quick else FULL,
                         say=lambda line: print(line, file=progress, flush=True))
    except (OSError, ValueError) as exc:  # no model, a broken GGUF, a draft that does not load
        raise ToolError(f"cannot measure this device: {' '.join(str(exc).split())}") from exc


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
    p = Parser(prog="edge-llm-ros plan", description="Measure this device and pick mode, draft shape and backend "
                                                     "(--device), or plan a stage pipeline (--pipeline).")
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--device", action="store_true", help="calibrate on this machine")
    what.add_argument("--pipeline", action="store_true", help="plan a stage pipeline over --devices")
    p.add_argument("--out", default=None, metavar="FILE",
                   help=f"where to save the plan (default {default_plan_path()}, ${PLAN_ENV} moves it; "
                        f"--pipeline: {pipeline_plan_path()})")
    p.add_argument("--threads", type=int, default=None,
                   help="--device: threads for both backends (default: every core)")
    p.add_argument("--quick", action="store_true", help="--device: fewer repeats and one calibration prompt")
    p.add_argument("--devices", default=None, metavar="FILE", help="--pipeline: the devices (see "
                   "config/devices.example.yaml; default: this machine's two cores, one thread each)")
    p.add_argument("--prompt-len", type=int, default=PlanRequest.prompt_len, metavar="N",
                   help="--pipeline: the prompt length to chunk for prefill (default %(default)s)")
    p.add_argument("--new-tokens", type=int, default=PlanRequest.new_tokens, metavar="N",
                   help="--pipeline: the answer length the KV cache must hold (default %(default)s)")
    p.add_argument("--min-chunk", type=int, default=PlanRequest.min_chunk, metavar="N",
                   help="--pipeline: the least prefill chunk, Jupiter's b (default %(default)s)")
    return p


# -- plan --pipeline --------------------------------------------------------------------------------


def pipeline_plan_path() -> Path:
    return default_plan_path().with_name("pipeline_plan.yaml")


def profile_path() -> Path:
    """Where the layer profile measured here is kept (next to the device plan)."""
    return default_plan_path().with_name("layer_profile.json")


def measured_acceptance(model: Path, err: TextIO):
    """τ of the saved device plan for ``model`` (plan --device measured it), else None."""
    from edge_llm_ros.core.planning.device_plan import PlanError, load_plan
    from edge_llm_ros.core.planning.planner import load_measurements

    path = default_plan_path()
    try:
        if path.is_file() and load_plan(path, model, warn=lambda line: print(line, file=err)) is not None:
            return AcceptanceCurve.measured(load_measurements(path))
    except (PlanError, ValueError):
        pass
    return None


def launch_commands(path: Path) -> list[str]:
    """The commands that launch the plan written at ``path`` (stages.launch.py's ``plan`` argument)."""
    return [f"edge-llm-ros launch stages plan:={path}", f"ros2 launch edge_llm_ros stages.launch.py plan:={path}"]


def plan_pipeline_command(args, out: TextIO, err: TextIO) -> int:
    from edge_llm_ros.core.engine.models import default_model_path, weights_folder

    start = time.monotonic()

    def say(line: str) -> None:
        print(line, file=err, flush=True)

    try:
        request = PlanRequest(args.prompt_len, args.new_tokens, args.min_chunk)
        folder = weights_folder()
        model = model_shape(folder)
        measure = lambda threads: saved_profile(profile_path(), folder, threads, say)  # noqa: E731
        devices = read_devices(args.devices, measure) if args.devices else default_devices(lambda: measure(1))
        acceptance = measured_acceptance(default_model_path().resolve(), err) or GHIDORAH
        plan = plan_pipeline(devices, model, request, acceptance)
    except PartitionError as exc:
        print(f"error: refused, nothing loaded: {one_line(exc)}", file=err, flush=True)
        return 2
    except (ValueError, OSError) as exc:
        print(f"error: {one_line(exc)}", file=err, flush=True)
        return 2
    path = Path(args.out) if args.out else pipeline_plan_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(plan.to_yaml())
    except OSError as exc:
        print(f"error: cannot write the plan: {exc}", file=err, flush=True)
        return 2
    print("\n".join(plan.summary()), file=out)
    print(f"\nplan: {plan.reason}", file=out)
    print(f"\nwrote {path} (planned in {time.monotonic() - start:.1f} s): its parameters, layered over "
          "config/stages.yaml; launch it with", file=out)
    print("\n".join(f"  {command}" for command in launch_commands(path)), file=out, flush=True)
    print(f"  (or with its launch arguments: {' '.join(plan.launch_arguments())})", file=out, flush=True)
    return 0


def main(argv: list[str] | None = None, out: TextIO | None = None, err: TextIO | None = None) -> int:
    out = sys.stdout if out is None else out
    err = sys.stderr if err is None else err
    try:
        args = build_parser().parse_args(argv)
        if args.pipeline:
            return plan_pipeline_command(args, out, err)
        path = Path(args.out) if args.out else default_plan_path()
        threads = set_threads(args.threads)
        plan = measure(threads, args.quick, err)
        save_plan(plan, path)
    except (ToolError, LoadError) as exc:
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
