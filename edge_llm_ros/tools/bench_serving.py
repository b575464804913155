"""``edge-llm-ros bench --scenario serving``: the launched pipeline serving 1 to 16 clients at once,
against llama.cpp's own sequential generation and a raw llama.cpp batched loop.

    edge-llm-ros bench --scenario serving --json serving.json          # 1,2,4,8,16 clients, 64 tokens
    edge-llm-ros bench --scenario serving --quick --json q.json         # 1,2,4 clients, 16 tokens

Three measurements, the two llama.cpp ones in this process before the pipeline starts (so that
nothing else competes for the cores while they run):

    baseline         llama.cpp's own greedy generation, one request after another
                     (``Llama.generate``, bench.py's run_llama_cpp): what a llama_ros user gets.
                     Its output per prompt is every request's solo reference.
    llama_cpp_batch  per client count N, the same requests decoded by a plain greedy loop on
                     core.engine.batching.LlamaBatch: N sequences at a time (one wave per round of the
                     clients), their prompts prefilled together, then one decode per step with a
                     row per unfinished sequence. No node, no messages: the ceiling for the node.
    node             ``launch/pipeline.launch.py`` (serve_node, ``max_requests:=16 engine:=llama.cpp
                     mode:=ar``: batched ar whatever the device plan says) as real
                     processes; N closed-loop clients in this process, each sending its share of
                     requests one after another (send, wait for the result, send the next).

Request r of client c asks prompt ``(r * N + c) % len(BENCH_PROMPTS)`` (chat template applied,
as serve_node does), so concurrent requests ask different prompts. Reported per N: aggregate
tokens/s (all tokens / first send to last result), per-request tokens/s (tokens / its send to
result, averaged), time to first token p50/p95 (send to the first feedback carrying tokens),
and whether every request's token ids equal its solo reference (the ones that do not are listed;
any makes the exit status 1). Ratios: node / llama_cpp_batch (what the node costs), node(N) /
node(1) (scaling) and node / baseline.

Here: the llama.cpp measurements, the arithmetic and the command line; the launched pipeline and
its clients in tools/serving_deployment.py; the table, the plot and the failures in
tools/serving_report.py. The bench harness (tools/bench_harness.py) runs the scenario registered
here.
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from pathlib import Path

from edge_llm_ros.core.planning.device_profile import cpu_name
from edge_llm_ros.errors import Status
from edge_llm_ros.tools.bench_harness import (
    CpuShare,
    Scenario,
    register,
    scenario_parser,
    utc_now,
    version_of,
)
from edge_llm_ros.tools.bench_runs import Run, run_llama_cpp
from edge_llm_ros.tools.deployment import EventLog
from edge_llm_ros.tools.loading import ToolError
from edge_llm_ros.tools.prompts import BENCH_PROMPTS, BenchPrompt
from edge_llm_ros.tools.serving_deployment import (
    LAUNCH,
    WARMUP_TOKENS,
    Request,
    node_runs,
    pipeline_plan,
    ready_conditions,
    schedule,
    serving_lines,
)
from edge_llm_ros.tools.serving_report import failures, format_table, plot

CLIENTS, QUICK_CLIENTS = (1, 2, 4, 8, 16), (1, 2, 4)
REQUESTS_PER_CLIENT, QUICK_REQUESTS_PER_CLIENT = 3, 2
MAX_NEW_TOKENS, QUICK_MAX_NEW_TOKENS = 64, 16
MAX_REQUESTS = 16  # serve_node's max_requests (at least the largest client count)
CONTEXT = 2048  # tokens per sequence, as serve_node's batch
N_BATCH = 512  # rows per llama_decode
# Launch arguments given when some node of the pipeline declares them (others are noted in the report).
MODEL_ARG, THREADS_ARG, MAX_REQUESTS_ARG = "model", "threads", "max_requests"


# -- the arithmetic ----------------------------------------------------------------------------------


def percentile(values: list[float], q: float) -> float | None:
    """The q-th percentile (0-100) with linear interpolation between order statistics (numpy's
    default); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    at = (len(ordered) - 1) * q / 100
    low = int(at)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (at - low)


def same_tokens(ours: list[int], reference: list[int], eos: int | None) -> bool:
    """Equal token ids; a trailing EOS on one side only does not count (whether it is reported is a
    server's choice, not a difference in the generation)."""
    def strip(t: list[int]) -> list[int]:
        return t[:-1] if t and eos is not None and t[-1] == eos else t

    return list(ours) == list(reference) or strip(list(ours)) == strip(list(reference))


def first_difference(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def summarize_node(requests: list[Request], references: list[list[int]], prompts: list[BenchPrompt],
                   eos: int | None) -> dict:
    """One client count on the node: throughput, latency and exactness of every request."""
    finished = [r for r in requests if r.done is not None]
    tokens = sum(len(r.tokens) for r in requests)
    wall = (max(r.done for r in finished) - min(r.sent for r in requests)) if finished else 0.0
    per_request = [len(r.tokens) / r.wall_s for r in finished if r.wall_s > 0]
    ttft = [r.first_token - r.sent for r in requests if r.first_token is not None]
    inexact = []
    for r in requests:
        ref = references[r.prompt]
        if r.status == Status.OK and same_tokens(list(r.tokens), ref, eos):
            continue
        inexact.append({"client": r.client, "request": r.index, "prompt": prompts[r.prompt].name,
                        "status": r.status, "error": r.error, "tokens": len(r.tokens), "reference_tokens": len(ref),
                        "first_difference": first_difference(list(r.tokens), ref)})
    return {
        "requests": len(requests),
        "tokens": tokens,
        "wall_s": wall,
        "aggregate_tokens_per_s": tokens / wall if wall > 0 else 0.0,
        "per_request_tokens_per_s": sum(per_request) / len(per_request) if per_request else None,
        "ttft_p50_s": percentile(ttft, 50),
        "ttft_p95_s": percentile(ttft, 95),
        "exact": not inexact,
        "inexact": inexact,
    }


def add_ratios(report: dict) -> None:
    """node / llama_cpp_batch, node(N) / node(1) and node / baseline, on each run; one client vs the
    baseline at the top."""
    def ratio(a, b):
        return a / b if a is not None and b else None

    base = report["baseline"]["tokens_per_s"]
    one = next((r["aggregate_tokens_per_s"] for r in report["runs"] if r["clients"] == 1), None)
    for run in report["runs"]:
        run["node_over_llama_cpp_batch"] = ratio(run["aggregate_tokens_per_s"], run["llama_cpp_batch_tokens_per_s"])
        run["over_one_client"] = ratio(run["aggregate_tokens_per_s"], one)
        run["over_baseline"] = ratio(run["aggregate_tokens_per_s"], base)
        run["llama_cpp_batch_over_baseline"] = ratio(run["llama_cpp_batch_tokens_per_s"], base)
    report["one_client_over_baseline"] = ratio(one, base)


# -- llama.cpp in this process -----------------------------------------------------------------------


def run_baseline(llm, prompt_ids: list[list[int]], max_new_tokens: int, eos: int | None) -> tuple[list[Run], dict]:
    """llama.cpp's own greedy generation of every prompt, one after another (after a warm-up):
    the solo references and the baseline's numbers."""
    run_llama_cpp(llm, prompt_ids[0], WARMUP_TOKENS, eos)
    runs = [run_llama_cpp(llm, ids, max_new_tokens, eos) for ids in prompt_ids]
    tokens, wall = sum(len(r.tokens) for r in runs), sum(r.wall_s for r in runs)
    return runs, {"tokens_per_s": tokens / wall if wall > 0 else 0.0, "tokens": tokens, "wall_s": wall,
                  "ttft_mean_s": sum(r.ttft_s for r in runs) / len(runs)}


def prefill_chunks(prompts: list[list[int]], n_batch: int) -> list[list[tuple[int, list[int], int]]]:
    """Every prompt's tokens as decode work, (sequence, tokens, first position) entries packed into
    decodes of at most ``n_batch`` rows (a prompt may span two); sequence i is prompt i."""
    chunks, chunk, room = [], [], n_batch
    for seq, ids in enumerate(prompts):
        at = 0
        while at < len(ids):
            take = min(len(ids) - at, room)
            chunk.append((seq, list(ids[at:at + take]), at))
            at, room = at + take, room - take
            if room == 0:
                chunks.append(chunk)
                chunk, room = [], n_batch
    return chunks + ([chunk] if chunk else [])


def greedy_batch(batch, prompts: list[list[int]], max_new_tokens: int, eos: int | None) -> list[list[int]]:
    """The plain loop on a LlamaBatch: prefill every prompt, then one decode per step with one row per
    unfinished sequence, argmax, until EOS or the token limit."""
    out: list[list[int]] = [[] for _ in prompts]

    def finished(seq: int) -> bool:
        return len(out[seq]) >= max_new_tokens or (eos is not None and out[seq][-1:] == [eos])

    for chunk in prefill_chunks(prompts, batch.n_batch):
        for (seq, tokens, first), logits in zip(chunk, batch.decode(chunk)):
            if first + len(tokens) == len(prompts[seq]):  # the prompt's last token: the first new one
                out[seq].append(int(logits.argmax()))
    running = [s for s in range(len(prompts)) if not finished(s)]
    while running:
        work = [(s, out[s][-1:], len(prompts[s]) + len(out[s]) - 1) for s in running]
        for s, logits in zip(running, batch.decode(work)):
            out[s].append(int(logits.argmax()))
        running = [s for s in running if not finished(s)]
    for seq in range(len(prompts)):
        batch.drop(seq)
    return out


def run_llama_cpp_batch(batch, prompt_ids: list[list[int]], plan: list[list[int]], max_new_tokens: int,
                        eos: int | None) -> tuple[dict, list[tuple[int, list[int]]]]:
    """The requests of ``plan`` (a client count's schedule) in waves, one per round of the clients:
    tokens/s over all of them, and (prompt index, tokens) of each."""
    outputs, tokens = [], 0
    start = time.perf_counter()
    for r in range(max(len(p) for p in plan)):
        wave = [p[r] for p in plan if r < len(p)]
        for prompt, generated in zip(wave, greedy_batch(batch, [prompt_ids[i] for i in wave], max_new_tokens, eos)):
            outputs.append((prompt, generated))
            tokens += len(generated)
    wall = time.perf_counter() - start
    return {"tokens_per_s": tokens / wall if wall > 0 else 0.0, "tokens": tokens, "wall_s": wall}, outputs


def llama_cpp_rows(model: Path, prompts: list[BenchPrompt], client_counts: list[int], per_client: int,
                   max_new_tokens: int, threads: int) -> dict:
    """The baseline and the llama_cpp_batch row of every client count (then both models are freed)."""
    from llama_cpp import Llama

    from edge_llm_ros.core.engine.batching import LlamaBatch
    from edge_llm_ros.core.engine.decoding import eos_ids
    from edge_llm_ros.core.engine.models import chat_prompt

    batch = LlamaBatch(model, sequences=max(client_counts), context=CONTEXT, n_threads=threads, n_batch=N_BATCH)
    llm = None
    try:
        llm = Llama(model_path=str(model), n_ctx=CONTEXT, n_threads=threads, n_threads_batch=threads,
                    n_batch=N_BATCH, verbose=False)
        tokenizer = batch.tokenizer
        stop_ids = eos_ids(batch)
        eos = stop_ids[0] if stop_ids else None  # llama.cpp's runs stop at one id
        prompt_ids = [chat_prompt(tokenizer, p.text) for p in prompts]
        with CpuShare() as share:
            solo, baseline = run_baseline(llm, prompt_ids, max_new_tokens, eos)
            references = [r.tokens for r in solo]
            greedy_batch(batch, prompt_ids[:1], WARMUP_TOKENS, eos)  # warm-up, untimed
            rows = {}
            for n in client_counts:
                row, outputs = run_llama_cpp_batch(batch, prompt_ids, schedule(n, per_client, len(prompts)),
                                                   max_new_tokens, eos)
                row["exact"] = all(same_tokens(t, references[i], eos) for i, t in outputs)
                rows[n] = row
    finally:
        batch.close()
        if llm is not None:
            llm.close()
    return {"baseline": baseline, "references": references, "rows": rows, "eos": eos,
            "prompt_tokens": [len(ids) for ids in prompt_ids], "other_processes_cores": share.cores}


def run_scenario(client_counts: list[int], per_client: int, max_new_tokens: int, threads: int, model: Path,
                 model_given: bool, extra_args: list[str], log_path: Path | None, progress: bool,
                 foxglove: int = 0) -> dict:
    prompts = list(BENCH_PROMPTS)
    max_requests = max(MAX_REQUESTS, *client_counts)
    # ar batched on llama.cpp whatever the device plan says: the exact batched path this bench is about
    wanted = [f"{MAX_REQUESTS_ARG}:={max_requests}", f"{THREADS_ARG}:={threads}", "engine:=llama.cpp", "mode:=ar"]
    plan, applied, left_out = pipeline_plan(wanted, [*([f"{MODEL_ARG}:={model}"] if model_given else []), *extra_args])
    started = time.perf_counter()
    llama = llama_cpp_rows(model, prompts, client_counts, per_client, max_new_tokens, threads)  # before the launch
    load_before_launch = os.getloadavg()
    log = EventLog(log_path)
    try:
        requests, watched = node_runs(plan, client_counts, per_client, prompts, max_new_tokens, log, progress,
                                      foxglove=foxglove)
    finally:
        log.close()
    runs = []
    for n in client_counts:
        run = {"clients": n, **summarize_node(requests[n], llama["references"], prompts, llama["eos"])}
        row = llama["rows"][n]
        run.update(llama_cpp_batch_tokens_per_s=row["tokens_per_s"], llama_cpp_batch_exact=row["exact"],
                   llama_cpp_batch_wall_s=row["wall_s"])
        runs.append(run)
    label = f"{os.cpu_count()}-core CPU, {model.stem}, greedy"
    report = {
        "scenario": "serving",
        "label": label,
        "date": utc_now(),
        "machine": {"cpu": cpu_name(), "cores": os.cpu_count(), "platform": platform.platform(),
                    "python": platform.python_version(), "llama_cpp_python": version_of("llama_cpp"),
                    "threads": threads, "load_average_before_launch": list(load_before_launch),
                    "other_processes_cores_llama_cpp_rows": llama["other_processes_cores"]},
        "model": str(model),
        "deployment": {"launch": LAUNCH, "nodes": [n.name for n in plan.nodes], "launch_arguments": applied,
                       "not_declared": left_out, "ready_lines": ready_conditions(plan),
                       "serve_node_said": serving_lines(log)},
        "max_new_tokens": max_new_tokens,
        "requests_per_client": per_client,
        "prompts": [{"name": p.name, "prompt_tokens": t} for p, t in zip(prompts, llama["prompt_tokens"])],
        "baseline": {"name": "llama_cpp sequential (Llama.generate greedy, one request after another)",
                     **llama["baseline"]},
        "runs": runs,
        "exact": all(r["exact"] for r in runs),
        "wall_s": time.perf_counter() - started,
        "notes": [
            f"{label}; llama.cpp with {threads} threads in the baseline, the raw batch and (threads:=) the node",
            "aggregate_tokens_per_s = all tokens of a client count / (first goal sent -> last result); "
            "per_request_tokens_per_s = mean over requests of tokens / (sent -> result), prefill and queueing "
            "included; ttft = sent -> first feedback carrying tokens",
            "llama_cpp_batch: the same requests, a wave per round of the clients, decoded by a plain greedy loop "
            "on core.engine.batching.LlamaBatch in the bench process (no node, no messages), before the pipeline starts",
            "exact: every request's token ids equal llama.cpp's sequential greedy output of its prompt (a trailing "
            "EOS on one side only is not counted as a difference)",
            "clients are threads of the bench process sharing one action client; the nodes and the bench share "
            "the machine's cores",
        ],
    }
    if left_out:
        report["notes"].append(f"not given (no node of the pipeline declares them): {', '.join(left_out)}")
    if watched is not None:
        def summary(requests):
            return summarize_node(requests, llama["references"], prompts, llama["eos"])

        report["foxglove"] = foxglove_report(watched, [summary(r) for r in watched["plain"]],
                                             [summary(p["requests"]) for p in watched["bridged"]])
        report["notes"].append(
            "foxglove: the largest client count again, same deployment, in rounds of two passes: without a bridge, "
            "then with foxglove_bridge_node started beside it and a Foxglove client (tools/foxglove_watch.py) "
            "subscribed to every channel; ratio = mean aggregate tokens/s of the bridged passes / of the plain ones; "
            "bridge_cores = the bridge's CPU seconds / the passes' wall seconds; target: ratio >= 0.95")
    add_ratios(report)
    return report


def foxglove_report(watched: dict, plain: list[dict], bridged: list[dict]) -> dict:
    without = [s["aggregate_tokens_per_s"] for s in plain]
    with_bridge = [s["aggregate_tokens_per_s"] for s in bridged]
    mean_without, mean_with = sum(without) / len(without), sum(with_bridge) / len(with_bridge)
    passes = watched["bridged"]
    cpu, wall = sum(p["bridge_cpu_s"] for p in passes), sum(p["wall_s"] for p in passes)
    return {"clients": watched["clients"], "rounds": len(passes), "tokens_per_s_without": mean_without,
            "tokens_per_s_with": mean_with, "passes_without": without, "passes_with": with_bridge,
            "ratio": mean_with / mean_without if mean_without else None,
            "exact": all(s["exact"] for s in plain + bridged),
            "channels": max(p["channels"] for p in passes), "messages": sum(p["messages"] for p in passes),
            "bytes": sum(p["bytes"] for p in passes), "bridge_cpu_s": cpu, "wall_s": wall,
            "bridge_cores": cpu / wall if wall else None}


# -- command line ------------------------------------------------------------------------------------


def client_counts(text: str) -> list[int]:
    try:
        counts = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ToolError(f"--clients takes comma-separated whole numbers, got {text!r}") from None
    if not counts or any(n < 1 for n in counts):
        raise ToolError(f"--clients takes numbers >= 1, got {text!r}")
    return sorted(set(counts))


def build_parser() -> argparse.ArgumentParser:
    p = scenario_parser("serving", "The launched pipeline serving concurrent clients, against llama.cpp sequential "
                        "and batched.", quick="a short run: fewer clients, requests and tokens",
                        png="plot aggregate tok/s vs clients", log=True)
    p.add_argument("--clients", default=None, metavar="LIST",
                   help=f"client counts (default {','.join(map(str, CLIENTS))}; "
                        f"--quick {','.join(map(str, QUICK_CLIENTS))})")
    p.add_argument("--requests-per-client", type=int, default=None, metavar="N",
                   help=f"requests each client sends, one after another (default {REQUESTS_PER_CLIENT}; "
                        f"--quick {QUICK_REQUESTS_PER_CLIENT})")
    p.add_argument("--max-new-tokens", type=int, default=None,
                   help=f"new tokens per request (default {MAX_NEW_TOKENS}; --quick {QUICK_MAX_NEW_TOKENS})")
    p.add_argument("--threads", type=int, default=None,
                   help="llama.cpp threads of the baseline, the raw batch and the node (default: every core it may run on)")
    p.add_argument("--model", default=None, metavar="GGUF",
                   help=f"the GGUF (default: the shipped SmolLM2-135M-Instruct; given to the node as {MODEL_ARG}:=)")
    p.add_argument("--set", action="append", default=[], metavar="NAME:=VALUE",
                   help="a launch argument for the pipeline (repeatable)")
    p.add_argument("--foxglove", type=int, nargs="?", const=None, default=0, metavar="ROUNDS",
                   help="then the largest client count again in ROUNDS rounds (default 3; --quick 1) of two passes: "
                        "without a bridge, and with foxglove_bridge_node and a Foxglove client on every channel: "
                        "tokens/s with and without, and the bridge's CPU")
    return p


def run(args: argparse.Namespace, progress: bool) -> dict:
    """The scenario on the parsed command line (the harness resolved --json, --png and --log); the
    report. ToolError for bad input, before anything starts."""
    counts = client_counts(args.clients or ",".join(map(str, QUICK_CLIENTS if args.quick else CLIENTS)))
    per_client, max_new = args.requests_per_client, args.max_new_tokens
    if per_client is None:
        per_client = QUICK_REQUESTS_PER_CLIENT if args.quick else REQUESTS_PER_CLIENT
    if max_new is None:
        max_new = QUICK_MAX_NEW_TOKENS if args.quick else MAX_NEW_TOKENS
    if per_client < 1 or max_new < 1:
        raise ToolError("--requests-per-client and --max-new-tokens must be >= 1")
    from edge_llm_ros.core.drafts.loading import usable_cores
    from edge_llm_ros.core.engine.llama_backend import llama_cpp_available

    threads = args.threads if args.threads is not None else usable_cores()
    if threads < 1:
        raise ToolError(f"--threads must be >= 1, got {threads}")
    from edge_llm_ros.core.engine.models import _model_path

    if not llama_cpp_available():
        raise ToolError("the serving bench needs llama-cpp-python (make install builds it)")
    try:
        model = _model_path(args.model)
    except FileNotFoundError as exc:
        raise ToolError(str(exc)) from None
    if model.suffix != ".gguf":
        raise ToolError(f"--model must be a .gguf file, got {model}")
    pipeline_plan([], [*([f"{MODEL_ARG}:={model}"] if args.model else []), *args.set])  # checked before loading
    rounds = (1 if args.quick else 3) if args.foxglove is None else args.foxglove
    if rounds < 0:
        raise ToolError(f"--foxglove takes a number of rounds (0: none), got {rounds}")
    return run_scenario(counts, per_client, max_new, threads, model, args.model is not None, args.set, args.log,
                        progress=progress, foxglove=rounds)




SCENARIO = register(Scenario(
    name="serving", help="the launched pipeline serving 1-16 concurrent clients, against llama.cpp sequential "
                         "and batched",
    build_parser=build_parser, run=run, format_table=format_table, failures=failures, plot=plot, verdict="exact",
    sends_goals=True, writes_log=True,
    busy_cores=lambda report: report["machine"]["other_processes_cores_llama_cpp_rows"],
))
