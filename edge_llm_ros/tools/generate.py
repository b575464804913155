"""``edge-llm-ros generate "prompt"``: stream one generation to stdout.

    edge-llm-ros generate "Go to the kitchen" --mode tree --max-new-tokens 64
    edge-llm-ros generate "def fib(n):" --raw --mode sd --draft shallow:10 --stats
    edge-llm-ros generate "Tell a story" --temperature 0.8 --top-p 0.9 --seed 1
    edge-llm-ros generate "Go to the kitchen" --backend llama.cpp --mode sd

Without ``--mode`` the saved device plan (``edge-llm-ros plan --device``; ``--plan FILE``, else
``$EDGE_LLM_ROS_PLAN`` or ``~/.config/edge_llm_ros/plan.json``) picks mode, shape, backend and
threads, and one ``plan: ...`` line on stderr says which (or that there is none and ``ar`` on torch
is used). Explicit flags win over the plan; ``--no-plan`` ignores it. On ``--backend llama.cpp``
the target is the GGUF on llama.cpp; the draft runs where ``--draft`` or the plan's draft backend
says (``llama.cpp``: the shipped draft's GGUF; else the torch draft, as ``bench``'s ``*_llama_cpp`` rows).

The chat template applies unless ``--raw``. Text is printed as tokens are accepted,
decoded incrementally so a multi-byte character split over tokens is printed whole.
``--stats`` prints τ, tokens/s and the draft/verify time split on stderr.
Exit codes: 0 success, 2 bad input (one ``error: ...`` line on stderr), 130 interrupted.

Function API: :func:`stream_text` (an already loaded target; what tests and nodes call)
and :func:`main` (argv in, exit status out).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

from edge_llm_ros.core.drafts.loading import (
    LLAMA_CPP,
    LoadError,
    NamedDrafter,
    check_draft_spec,
    load_models,
    one_line,
    set_threads,
)
from edge_llm_ros.core.engine.config import MODES, GenerationConfig, GenerationStats, preset
from edge_llm_ros.core.engine.decoding import generate
from edge_llm_ros.core.engine.detokenize import IncrementalDecoder
from edge_llm_ros.core.engine.models import chat_prompt, default_model_path, encode
from edge_llm_ros.core.planning.device_plan import BACKENDS, DevicePlan, PlanError, default_plan_path, load_plan
from edge_llm_ros.tools.loading import ToolError, add_shape_arguments, shape_overrides

EXIT_OK, EXIT_USAGE, EXIT_INTERRUPTED = 0, 2, 130
DEFAULT_MODE = GenerationConfig.mode  # core's default (every mode is lossless; pick one with --mode)
DEFAULT_BACKEND = "torch"
TINY_MODEL = "tiny-random-llama"  # what a plan for the --tiny test model names as its model


def prompt_ids(target, prompt: str, raw: bool) -> list[int]:
    """The prompt as token ids: chat template applied unless ``raw``."""
    if not prompt.strip():
        raise ToolError("prompt is empty")
    if target.tokenizer is None:
        raise ToolError("the model has no tokenizer: cannot encode a text prompt")
    return encode(target.tokenizer, prompt) if raw else chat_prompt(target.tokenizer, prompt)


def start_generation(
    target, prompt: str, config: GenerationConfig, drafter=None, *, raw: bool = False,
    stats: GenerationStats | None = None,
) -> Iterator[int]:
    """Check the request and start it: the token ids as the target accepts them.

    Raises ToolError for a bad request (empty prompt, prompt longer than the context window,
    incompatible drafter) before any token is generated.
    """
    ids = prompt_ids(target, prompt, raw)
    try:
        return generate(target, ids, config, drafter if config.mode != "ar" else None, stats)
    except ValueError as exc:
        raise ToolError(str(exc)) from exc


def write_stream(tokenizer, tokens_iter: Iterator[int], out: TextIO) -> tuple[str, list[int]]:
    """Write the text of ``tokens_iter`` to ``out`` as it becomes final; (text, token ids)."""
    decoder = IncrementalDecoder(tokenizer)
    pieces, tokens = [], []
    for token in tokens_iter:
        tokens.append(token)
        piece = decoder.push(token)
        if piece:
            pieces.append(piece)
            out.write(piece)
            out.flush()
    tail = decoder.finish()
    if tail:
        pieces.append(tail)
        out.write(tail)
    text = "".join(pieces)
    if not text.endswith("\n"):
        out.write("\n")
    out.flush()
    return text, tokens


def stream_text(
    target,
    prompt: str,
    config: GenerationConfig,
    drafter=None,
    *,
    raw: bool = False,
    out: TextIO | None = None,
    stats: GenerationStats | None = None,
) -> tuple[str, list[int], GenerationStats]:
    """Generate from a text prompt, writing text to ``out`` (default stdout) as tokens arrive.

    Returns (text, token ids, stats). Raises ToolError for a bad request (empty prompt,
    prompt longer than the context window, incompatible drafter) before anything is written.
    """
    out = sys.stdout if out is None else out
    stats = GenerationStats() if stats is None else stats
    tokens_iter = start_generation(target, prompt, config, drafter, raw=raw, stats=stats)
    text, tokens = write_stream(target.tokenizer, tokens_iter, out)
    return text, tokens, stats


def format_stats(stats: GenerationStats, draft: NamedDrafter | None, wall_s: float) -> str:
    """One line for ``--stats``: τ, tokens/s, TTFT and where the time went."""
    busy = stats.draft_time_s + stats.verify_time_s
    share = (lambda t: f"{100 * t / busy:.0f}%") if busy > 0 else (lambda t: "-")
    tok_s = stats.new_tokens / wall_s if wall_s > 0 else 0.0
    parts = [
        f"mode={stats.mode}",
        f"draft={draft.spec if draft is not None and stats.mode != 'ar' else '-'}",
        f"new_tokens={stats.new_tokens}",
        f"rounds={stats.rounds}",
        f"tau={stats.tau:.2f}",
        f"acceptance={stats.acceptance_rate:.2f}",
        f"tokens/s={tok_s:.1f}",
        f"ttft={stats.ttft_s * 1000:.0f}ms",
        f"draft_time={stats.draft_time_s:.2f}s({share(stats.draft_time_s)})",
        f"verify_time={stats.verify_time_s:.2f}s({share(stats.verify_time_s)})",
        f"finish={stats.finish_reason or '-'}",
    ]
    return "stats: " + " ".join(parts)


# -- command line -------------------------------------------------------------------------------


class Parser(argparse.ArgumentParser):
    """argparse that reports bad usage as one ``error:`` line (ToolError) instead of usage + exit."""

    def error(self, message: str):
        raise ToolError(message)


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="edge-llm-ros generate", description="Generate text from a prompt, streamed to stdout.")
    p.add_argument("prompt", help="the prompt text (a user message, unless --raw)")
    p.add_argument("--mode", default=None,
                   help=f"decoding mode: {', '.join(MODES)} (default: the device plan's, else {DEFAULT_MODE})")
    p.add_argument("--backend", default=None, choices=BACKENDS,
                   help=f"where the target runs (default: the device plan's, else {DEFAULT_BACKEND})")
    p.add_argument("--plan", default=None, metavar="FILE", help="the device plan to use when --mode is not given "
                                                                f"(default: {home_relative(default_plan_path())})")
    p.add_argument("--no-plan", action="store_true", help="ignore the device plan: --mode, --backend or the defaults")
    p.add_argument("--max-new-tokens", type=int, default=128, help="at most this many new tokens (default: 128)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default); > 0 samples")
    p.add_argument("--top-k", type=int, default=0, help="sample from the k most likely tokens (0 = off)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass (1 = off)")
    p.add_argument("--seed", type=int, default=None, help="seed for sampling (default: random)")
    p.add_argument("--stop", action="append", default=[], metavar="TEXT", help="stop string (repeatable)")
    p.add_argument("--raw", action="store_true", help="feed the prompt as is, without the chat template")
    p.add_argument("--model", default=None, metavar="PATH", help="HF model directory or .gguf (default: SmolLM2-135M-Instruct)")
    p.add_argument("--draft", default=None, metavar="SPEC", help="shallow[:K[:V]], exit:K[:PATH], lookup, or a draft model path")
    add_shape_arguments(p)
    p.add_argument("--stats", action="store_true", help="print tau, tokens/s and the draft/verify split on stderr")
    p.add_argument("--threads", type=int, default=None, help="threads (default: the device plan's, else every core)")
    p.add_argument("--tiny", action="store_true", help=argparse.SUPPRESS)  # tiny random model, for tests
    return p


# -- the device plan ------------------------------------------------------------------------------


def home_relative(path: Path) -> str:
    """``path`` with the home folder written as ``~``."""
    home = Path.home()
    return f"~/{path.relative_to(home)}" if path.is_relative_to(home) else str(path)


def plan_model(args: argparse.Namespace) -> str:
    """The target file this run loads, which a plan must have been measured for."""
    if args.tiny:
        return TINY_MODEL
    if args.model is not None:
        return args.model
    try:
        return str(default_model_path())
    except FileNotFoundError as exc:
        raise ToolError(str(exc)) from exc


def resolve_plan(args: argparse.Namespace) -> tuple[DevicePlan | None, str | None]:
    """The device plan for this run (None: --mode or the defaults) and the line that says so."""
    if args.plan is not None and args.no_plan:
        raise ToolError("--plan and --no-plan contradict each other")
    if args.mode is not None:
        return None, None  # an explicit mode: the plan is not consulted
    default = f"default {DEFAULT_MODE} on {args.backend or DEFAULT_BACKEND}"
    if args.no_plan:
        return None, f"plan: not used (--no-plan); {default}"
    path = Path(args.plan).expanduser() if args.plan is not None else default_plan_path()
    if args.plan is not None and not path.is_file():
        raise ToolError(f"--plan: {args.plan} not found")
    skipped: list[str] = []
    try:
        plan = load_plan(path, plan_model(args) if path.exists() else None, warn=skipped.append)
    except PlanError as exc:
        raise ToolError(f"{exc} (edge-llm-ros plan --device writes a new one; --no-plan ignores it)") from exc
    if plan is not None:
        forced = f", on {args.backend} (--backend)" if args.backend not in (None, plan.backend) else ""
        return plan, f"plan: {plan.describe()} (from {home_relative(path)}){forced}"
    if skipped:
        return None, f"plan: not used ({skipped[0]}); {default}"
    return None, f"plan: none at {home_relative(path)} (edge-llm-ros plan --device makes one); {default}"


def config_from_args(args: argparse.Namespace, plan: DevicePlan | None = None) -> GenerationConfig:
    """The flags over the plan's mode and shape (if any) over the mode's preset."""
    mode = args.mode or (plan.mode if plan is not None else DEFAULT_MODE)
    shape = {**(plan.overrides() if plan is not None else {}), **shape_overrides(args)}
    try:
        return preset(
            mode,
            max_new_tokens=args.max_new_tokens,
            temperature=args.temperature,
            top_k=args.top_k,
            top_p=args.top_p,
            seed=args.seed,
            stop_strings=tuple(args.stop),
            **shape,
        )
    except ValueError as exc:
        raise ToolError(str(exc)) from exc


# -- backends -----------------------------------------------------------------------------------


def choose_backend(args: argparse.Namespace, plan: DevicePlan | None) -> str:
    """``--backend``, else the plan's, else torch; ToolError when that backend cannot run this request."""
    backend = args.backend or (plan.backend if plan is not None else DEFAULT_BACKEND)
    if backend == "torch":
        return backend
    from edge_llm_ros.core.engine.llama_backend import llama_cpp_available

    by = "--backend llama.cpp" if args.backend else f"the plan {home_relative(plan.path)}"
    instead = "--backend torch" if args.backend else "--backend torch or --no-plan (or measure again: plan --device)"
    if args.tiny:
        raise ToolError(f"{by} picks llama.cpp, which runs .gguf models, and --tiny is a torch model: use {instead}")
    if args.model is not None and Path(args.model).suffix != ".gguf":
        raise ToolError(f"{by} picks llama.cpp, which runs .gguf models, not {args.model}: use {instead}")
    if not llama_cpp_available():
        raise ToolError(f"{by} picks llama.cpp, but llama-cpp-python is not installed (make install builds it): "
                        f"use {instead}")
    return backend


def draft_spec(args: argparse.Namespace, plan: DevicePlan | None) -> str | None:
    """``--draft``, else the plan's draft backend's default draft (``llama.cpp``: the shipped draft's GGUF)."""
    if args.draft is None and plan is not None and plan.draft_backend == LLAMA_CPP:
        return LLAMA_CPP
    return args.draft


def main(argv: list[str] | None = None, out: TextIO | None = None, err: TextIO | None = None) -> int:
    out = sys.stdout if out is None else out
    err = sys.stderr if err is None else err
    target = None
    try:
        args = build_parser().parse_args(argv)
        plan, plan_line = resolve_plan(args)
        config = config_from_args(args, plan)  # bad mode / numbers fail here, before any model loads
        if not args.prompt.strip():
            raise ToolError("prompt is empty")
        spec = draft_spec(args, plan)
        check_draft_spec(spec)
        backend = choose_backend(args, plan)
        threads = set_threads(args.threads or (plan.threads if plan is not None else None))
        target, draft = load_models(args.model, backend, config.mode, threads, spec, tiny=args.tiny)
        stats = GenerationStats()
        start = time.perf_counter()
        tokens = start_generation(target, args.prompt, config, draft.drafter if draft else None, raw=args.raw,
                                  stats=stats)
        if plan_line:
            print(plan_line, file=err, flush=True)
        write_stream(target.tokenizer, tokens, out)
        if args.stats:
            print(format_stats(stats, draft, time.perf_counter() - start), file=err, flush=True)
        return EXIT_OK
    except (ToolError, LoadError) as exc:
        print(f"error: {one_line(exc)}", file=err, flush=True)
        return EXIT_USAGE
    except SystemExit as exc:  # --help
        return int(exc.code or 0)
    except KeyboardInterrupt:
        out.write("\n")
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # `| head`: the reader left; nothing more to say
        return EXIT_OK
    finally:
        if target is not None:
            target.close()  # a llama.cpp context's memory (nothing for a torch model)


if __name__ == "__main__":
    sys.exit(main())
