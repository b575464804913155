"""``edge-llm-ros bench --scenario edge-cloud``: cloud AR, edge-cloud SD and early exits over
emulated links (EE, Table 6's columns).

    edge-llm-ros bench --scenario edge-cloud --json ec.json          # RTT 10/50/120 ms x 20/100 Mbit/s
    edge-llm-ros bench --scenario edge-cloud --rtt 50 --bandwidth 100 --modes ar,sd,ee --quick
    edge-llm-ros bench --scenario edge-cloud --draft-backends llama.cpp --rtt 50 --bandwidth 100

For each link setting and each draft backend (``--draft-backends``: torch and llama.cpp when
llama-cpp-python is installed) a fresh deployment of ``launch/edge_cloud.launch.py`` runs:
verifier_node and draft_node (``draft_backend:=...``) as two processes, one thread each (torch's,
or each llama.cpp drafter's), sharing the machine's cores (``--pin``: each on a core of its own with
``taskset``; on the 2-core dev machine that was slower, 5-15%: each node's Zenoh and Python threads
then queue behind its compute), the link emulated in the runtime (one-way latency RTT/2 and the
bandwidth each way; figures are labelled "emulated link"). This process is the robot's
application: it sends Generate goals, each prompt in every mode in turn, and times each goal from
sending to its result. ``ar`` drafts nothing, so it runs once per setting, in the first backend's
deployment, and is every backend's reference. Modes (draft_node's EDGE_MODES):

    ar    cloud autoregressive: the prompt goes up, the verifier generates, every token comes down
    sd    edge-cloud speculative decoding: γ drafted on the robot per round, final outcomes only
    fsd   EE's fast SD (Algorithm 1): pre-drafts from early-exit outcomes, served when the final arrives
    ee    fsd, and a pre-draft finished before its final goes up at once (verified if the final agrees)

Reported per setting: latency per token of each mode, speedups AR→SD, SD→FSD, SD→EE, τ, cache
miss rate r, average exit layer of the hits, the time split per round (draft on the critical
path, verification on the server, the rest: link and queues), and EE Appendix B's projection
(γc+1)/(rγc+1) with the measured c = T_p/T_q and r next to the measured SD→FSD. Every mode's
tokens are compared with ``ar`` (the target's own greedy decoding): a mismatch makes the exit
status 1. ``--png`` plots the speedups against RTT (needs matplotlib: the ``bench`` extra).

Draft backends side by side: ``draft_ms_per_token`` is the robot's drafting time per drafted
token, measured in ``sd`` (every round drafts γ tokens on the critical path, so it is all of the
drafting): Σ draft_time_s / (rounds × γ), the draft model's prefill of the prompt in round 0
included. The table ends with torch / llama.cpp ratios of it and of each mode's latency per token.

JSON layout: ``runs[i]`` holds the first backend's results as before (``runs[i]["ar"]``,
``["sd"]``, ``["speedup"]``, ..., and ``["draft_backend"]`` naming it: torch by default); every
further backend's are under its key (``runs[i]["llama_cpp"]``: the same keys but ``ar``, with
speedups against the shared ``ar``); ``runs[i]["torch_over_llama_cpp"]`` has the ratios.

The table, the plot and the failures read the report in tools/edge_cloud_report.py; the bench
harness (tools/bench_harness.py) runs the scenario registered here.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from edge_llm_ros.core.drafts.loading import LLAMA_CPP, LoadError, check_draft_spec, resolve_draft_backend
from edge_llm_ros.core.engine.llama_backend import llama_cpp_available
from edge_llm_ros.tools.bench_harness import (
    Scenario,
    machine_info,
    progress_bar,
    register,
    scenario_parser,
    utc_now,
)
from edge_llm_ros.tools.deployment import Deployment, EventLog, ask_profile, local_router, node_backend
from edge_llm_ros.tools.edge_cloud_report import LABEL, backend_key, backend_results, failures, format_table, plot
from edge_llm_ros.tools.loading import ToolError
from edge_llm_ros.tools.prompts import BENCH_PROMPTS, QUICK_PROMPTS, BenchPrompt

RTTS_MS = (10.0, 50.0, 120.0)
BANDWIDTHS_MBPS = (20.0, 100.0)
MODES = ("ar", "sd", "fsd", "ee")
DRAFT_BACKENDS = ("torch", LLAMA_CPP)
DEFAULT_PROMPTS = 3
MAX_NEW_TOKENS, QUICK_MAX_NEW_TOKENS = 64, 16
WARMUP_TOKENS = 8
START_TIMEOUT_S = 300.0  # model loading of both nodes
GOAL_TIMEOUT_S = 600.0
TARGETS = {"rtt_ms": 50.0, "sd_to_ee": 1.15, "ar_to_sd": 1.5, "max_cache_miss_rate": 0.40}


# -- one deployment -------------------------------------------------------------------------------------


def edge_cloud_plan(rtt_ms: float, bandwidth_mbps: float, args: list[str], cores: dict[str, int] | None = None):
    """launch/edge_cloud.launch.py with one link setting (one-way latency RTT/2 and the bandwidth each
    way) and ``args``; each node pinned to its core in ``cores`` (launch_ros' prefix), as on two devices."""
    from edge_llm_ros.runtime.launcher import apply_launch_args, load_plan

    one_way = rtt_ms / 2
    plan = load_plan("edge_cloud")
    for node in plan.nodes:
        if cores and node.name in cores:
            node.prefix = ["taskset", "-c", str(cores[node.name])]
    apply_launch_args(plan, [
        f"link_emulation.uplink.latency_ms:={one_way}", f"link_emulation.downlink.latency_ms:={one_way}",
        f"link_emulation.uplink.bandwidth_mbps:={bandwidth_mbps}",
        f"link_emulation.downlink.bandwidth_mbps:={bandwidth_mbps}", *args,
    ])
    return plan


class Client:
    """This process as the robot's application: an LLMClient on /edge_llm/generate."""

    def __init__(self) -> None:
        from edge_llm_ros.client import LLMClient

        self.llm = LLMClient("/edge_llm", timeout=GOAL_TIMEOUT_S, backend=node_backend())
        self.node = self.llm.node

    def wait_ready(self, deployment: Deployment, timeout: float) -> None:
        """Until verifier_node and draft_node (serving /edge_llm/generate) are lifecycle-active and each
        subscribes to the other's topic."""
        deadline = time.monotonic() + timeout
        self.llm.wait_until_active("/edge_llm/verifier_node", timeout, check=deployment.check_alive)
        self.llm.wait_until_ready(max(deadline - time.monotonic(), 0.0), check=deployment.check_alive)
        while not (self.node.count_subscribers("/edge_llm/draft") >= 1
                   and self.node.count_subscribers("/edge_llm/verify") >= 1):
            deployment.check_alive()
            if time.monotonic() > deadline:
                raise ToolError(f"the edge-cloud nodes did not subscribe to draft and verify within {timeout:g} s; "
                                f"their last lines:\n{deployment.log.tail()}")
            time.sleep(0.2)

    def generate(self, prompt: str, mode: str, max_new_tokens: int) -> Goal:
        from edge_llm_ros.errors import RequestError

        start = time.perf_counter()
        try:
            result = self.llm.generate(prompt, mode=mode, max_new_tokens=max_new_tokens)
        except (RequestError, TimeoutError) as exc:
            raise ToolError(f"a {mode} goal failed: {exc}") from None
        return Goal(result.token_ids, time.perf_counter() - start, result.stats)

    def close(self) -> None:
        self.llm.close()


@dataclass
class Goal:
    tokens: list[int]
    wall_s: float
    stats: object  # edge_llm_ros.client.Stats (InferenceStats' fields)


# -- the measurement ------------------------------------------------------------------------------------


def summarize(goals: list[Goal], gamma: int) -> dict:
    """One mode over the prompts: latency per token and EE Table 6's columns, the time split per round."""
    tokens = sum(len(g.tokens) for g in goals)
    wall = sum(g.wall_s for g in goals)
    rounds = sum(len(g.tokens) / g.stats.tau for g in goals if g.stats.tau > 0)
    draft = sum(g.stats.draft_time_s for g in goals)
    verify = sum(g.stats.verify_time_s for g in goals)
    hit_rounds = [(g.stats.avg_exit_layer, len(g.tokens) / g.stats.tau * (1 - g.stats.cache_miss_rate))
                  for g in goals if g.stats.tau > 0 and g.stats.avg_exit_layer > 0]
    weight = sum(w for _, w in hit_rounds)
    miss = [(g.stats.cache_miss_rate, len(g.tokens) / g.stats.tau) for g in goals if g.stats.tau > 0]
    per_round = (lambda seconds: 1000 * seconds / rounds) if rounds else (lambda _: None)
    return {
        "ms_per_token": 1000 * wall / tokens if tokens else None,
        "tokens": tokens,
        "wall_s": wall,
        "ttft_ms": 1000 * sum(g.stats.ttft_s for g in goals) / len(goals),
        "tau": tokens / rounds if rounds else None,
        "rounds": rounds,
        "cache_miss_rate": sum(r * n for r, n in miss) / sum(n for _, n in miss) if miss else None,
        "avg_exit": sum(layer * w for layer, w in hit_rounds) / weight if weight else None,
        "draft_ms_per_round": per_round(draft),  # drafting on the critical path (robot)
        "verify_ms_per_round": per_round(verify),  # the verifier's own time (server)
        "link_ms_per_round": per_round(wall - draft - verify),  # the rest: link, queues, messages
        "draft_ms_per_token_drafted": 1000 * draft / (rounds * gamma) if rounds and gamma else None,
    }


def appendix_b(modes: dict, gamma: int) -> dict | None:
    """EE Appendix B: speedup of fsd over sd = (γc+1)/(rγc+1), c = T_p/T_q from sd, r from fsd."""
    from edge_llm_ros.core.edge_cloud import projected_speedup

    sd, fsd = modes.get("sd"), modes.get("fsd") or modes.get("ee")
    if not sd or not fsd or not sd.get("verify_ms_per_round") or fsd.get("cache_miss_rate") is None:
        return None
    c = sd["draft_ms_per_token_drafted"] / sd["verify_ms_per_round"]
    r = fsd["cache_miss_rate"]
    out = {"gamma": gamma, "c": c, "r": r, "projected_sd_to_fsd": projected_speedup(gamma, c, r)}
    if "fsd" in modes:
        out["measured_sd_to_fsd"] = sd["ms_per_token"] / modes["fsd"]["ms_per_token"]
    # EE Table 4 with the measured T_q, T_p and T_c (one-way link + messages: half of the rest per round)
    t_q, t_p, t_c = sd["verify_ms_per_round"], sd["draft_ms_per_token_drafted"], sd["link_ms_per_round"] / 2
    if sd.get("tau"):
        out["table4_sd_ms_per_token"] = (2 * t_c + gamma * t_p + t_q) / sd["tau"]
        out["table4_fsd_ms_per_token"] = (2 * t_c + r * gamma * t_p + t_q) / sd["tau"]  # T_r taken as 0
    return out


def speedups(modes: dict) -> dict:
    def ratio(a: str, b: str) -> float | None:
        if a in modes and b in modes and modes[b]["ms_per_token"]:
            return modes[a]["ms_per_token"] / modes[b]["ms_per_token"]
        return None

    pairs = {"ar_to_sd": ("ar", "sd"), "sd_to_fsd": ("sd", "fsd"), "sd_to_ee": ("sd", "ee"), "ar_to_ee": ("ar", "ee"),
             "fsd_to_ee": ("fsd", "ee")}
    return {name: ratio(a, b) for name, (a, b) in pairs.items()}


def run_goals(client: Client, deployment: Deployment, prompts: list[BenchPrompt], modes: list[str],
              max_new_tokens: int, progress) -> dict[str, list[Goal]]:
    """Every prompt in every mode on one deployment, after an untimed warm-up per mode."""
    client.wait_ready(deployment, START_TIMEOUT_S)
    for mode in modes:  # warm-up, untimed: first-call costs of each path
        client.generate(prompts[0].text, mode, WARMUP_TOKENS)
    goals: dict[str, list[Goal]] = {m: [] for m in modes}
    for prompt in prompts:
        for mode in modes:  # interleaved, so load from elsewhere hits every mode alike
            goals[mode].append(client.generate(prompt.text, mode, max_new_tokens))
            progress.update(1)
    return goals


def report_backend(goals: dict[str, list[Goal]], prompts: list[BenchPrompt], gamma: int,
                   reference: dict | None = None) -> dict:
    """One backend's modes: their summaries, speedups and Appendix B, each mode's tokens compared
    with ``ar`` (its own, or ``reference``: the goals and summary of the first backend's ``ar``)."""
    ar_goals = goals.get("ar") or (reference or {}).get("goals")
    mismatches = []
    for mode, runs in goals.items():
        for prompt, run, ref in zip(prompts, runs, ar_goals or runs):
            if run.tokens != ref.tokens:
                mismatches.append({"mode": mode, "prompt": prompt.name})
    out = {m: summarize(runs, gamma if m != "ar" else 0) for m, runs in goals.items()}
    with_ar = {"ar": reference["summary"], **out} if reference and "ar" not in out else out
    sd = out.get("sd") or {}
    return {**out, "speedup": speedups(with_ar), "appendix_b": appendix_b(out, gamma),
            "draft_ms_per_token": sd.get("draft_ms_per_token_drafted"),
            "lossless": not mismatches if ar_goals else None, "mismatches": mismatches}


def compare_backends(first: dict, second: dict, modes: list[str]) -> dict:
    """``first`` / ``second`` (> 1: the second is faster): draft time per drafted token and each
    mode's latency per token."""
    def ratio(a, b):
        return a / b if a is not None and b else None

    return {"draft_ms_per_token": ratio(first["draft_ms_per_token"], second["draft_ms_per_token"]),
            "ms_per_token": {m: ratio(first[m]["ms_per_token"], second[m]["ms_per_token"])
                             for m in modes if m != "ar" and m in first and m in second}}


def node_cores(pin: bool) -> dict[str, int] | None:
    """The core each node is pinned to (verifier_node, draft_node: two devices), or None: not pinned
    (``pin`` off, fewer than two usable cores, or no taskset)."""
    usable = sorted(os.sched_getaffinity(0))
    if not pin or len(usable) < 2 or shutil.which("taskset") is None:
        return None
    return {"verifier_node": usable[0], "draft_node": usable[1]}


def run_scenario(rtts: list[float], bandwidths: list[float], prompts: list[BenchPrompt], modes: list[str],
                 max_new_tokens: int, gamma: int, draft: str, log_path: Path | None, progress: bool,
                 launch_args: list[str] = (), backends: list[str] = ("torch",), pin: bool = False,
                 simulate: bool = False) -> dict:
    with local_router("edge-cloud-router") as endpoint:  # this process's session and the nodes meet here
        log = EventLog(log_path)
        cores = node_cores(pin)
        settings = [(rtt, bw) for rtt in rtts for bw in bandwidths]
        node_args = ["threads:=1", f"gamma:={gamma}", "timeout_s:=120.0", "stats_period_s:=0.0"]
        if draft:
            node_args.append(f"draft:={draft}")
        node_args += launch_args
        later_modes = [m for m in modes if m != "ar"]  # ar drafts nothing: once per setting, first backend
        goals_total = len(settings) * len(prompts) * (len(modes) + len(later_modes) * (len(backends) - 1))
        runs, client, server_s = [], Client(), None
        started = time.perf_counter()
        try:
            with progress_bar(goals_total, "edge-cloud", "goal", progress) as bar:
                for rtt, bw in settings:
                    run: dict = {"rtt_ms": rtt, "bandwidth_mbps": bw, "draft_backend": backends[0]}
                    reference = None
                    for i, backend in enumerate(backends):
                        bar.set_postfix_str(f"RTT {rtt:g} ms, {bw:g} Mbit/s, draft on {backend}")
                        plan = edge_cloud_plan(rtt, bw, [*node_args, f"draft_backend:={backend}"], cores)
                        with Deployment(plan, endpoint, log, "edge-cloud deployment") as deployment:
                            goals = run_goals(client, deployment, prompts, modes if i == 0 else later_modes,
                                              max_new_tokens, bar)
                            if simulate and server_s is None:  # the server measures itself where it runs
                                from edge_llm_ros.tools.edge_cloud_sim import SERVER_CACHED, SERVER_ROWS

                                server_s = ask_profile(client.node, "/edge_llm/verifier_node/profile", SERVER_ROWS,
                                                       SERVER_CACHED)
                        result = report_backend(goals, prompts, gamma, reference)
                        if i == 0:
                            run.update(result)
                            if "ar" in goals:
                                reference = {"goals": goals["ar"], "summary": result["ar"]}
                        else:
                            run[backend_key(backend)] = result
                    if set(DRAFT_BACKENDS) <= set(backends):
                        torch_run = run if backends[0] == "torch" else run["torch"]
                        llama_run = run if backends[0] == LLAMA_CPP else run[backend_key(LLAMA_CPP)]
                        run["torch_over_llama_cpp"] = compare_backends(torch_run, llama_run, modes)
                    runs.append(run)
            simulated = None
            if simulate and backends[0] == "torch":  # the simulator times the torch draft only
                from edge_llm_ros.core.engine.models import chat_prompt
                from edge_llm_ros.tools.edge_cloud_sim import calibrate, load_nodes_models, simulate_report

                print("simulating the runs (core/sim/edge_cloud.py, costs measured here)...", file=sys.stderr, flush=True)
                target, exits, drafters = load_nodes_models()
                ids = [chat_prompt(target.tokenizer, p.text) for p in prompts]
                model = calibrate(target, exits, drafters, ids[:1], gamma, max_new_tokens, server_s=server_s)
                try:
                    simulated = simulate_report(model, runs, modes, ids, gamma, max_new_tokens, bool(cores))
                finally:
                    model.robot.close()
        finally:
            client.close()
            log.close()
    return {
        "scenario": "edge-cloud",
        "label": LABEL,
        "date": utc_now(),
        "machine": machine_info(),
        "deployment": {"launch": "edge_cloud", "processes": ["verifier_node", "draft_node"], "torch_threads": 1,
                       "llama_cpp_threads_per_drafter": 1, "draft": draft or "shipped", "exits": "shipped",
                       "gamma": gamma, "draft_backends": backends, "cores": cores,
                       "launch_arguments": [*node_args, "draft_backend:=<each of draft_backends>"]},
        "max_new_tokens": max_new_tokens,
        "prompts": [{"name": p.name, "text": p.text} for p in prompts],
        "modes": modes,
        "draft_backends": backends,
        "targets": TARGETS,
        "wall_s": time.perf_counter() - started,
        "runs": runs,
        "lossless": all(r["lossless"] is not False for run in runs for r in backend_results(run, backends)),
        "simulated": simulated,
        "notes": [
            f"latency: {LABEL} (one-way delay RTT/2 and a token bucket each way, applied by the runtime to real "
            "messages between the two processes); both processes share this machine's cores",
            "ms_per_token = goal wall time (sent -> result, prefill included) / generated tokens, over all prompts",
            "draft = drafting on the robot's critical path; verify = the verifier's own time; link = the rest",
            "appendix_b: c = T_p / T_q with T_p per drafted token and T_q per verification (both from sd); "
            "r from fsd (ee when fsd is not run)",
            "runs[i] holds the first draft backend's results (draft_backend); each further backend's are under its "
            "key (llama.cpp: llama_cpp); ar drafts nothing and runs once per setting, with the first backend",
            "draft_ms_per_token: drafting time per drafted token in sd, sum(draft_time_s) / (rounds * gamma), "
            "round 0's prefill of the prompt by the draft included; torch_over_llama_cpp: torch / llama.cpp "
            "(> 1: llama.cpp faster) of it and of each mode's ms_per_token",
        ],
    }


# -- command line -------------------------------------------------------------------------------------


def _numbers(text: str, flag: str) -> list[float]:
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ToolError(f"{flag} takes comma-separated numbers, got {text!r}") from None
    if not values or any(v < 0 for v in values):
        raise ToolError(f"{flag} takes numbers >= 0, got {text!r}")
    return values


def check_launch_args(items: list[str]) -> None:
    """--set values are launch arguments the edge_cloud launch file knows (checked before anything starts)."""
    from edge_llm_ros.runtime.launcher import LaunchError, apply_launch_args, load_plan

    try:
        apply_launch_args(load_plan("edge_cloud"), items)
    except LaunchError as exc:
        raise ToolError(f"--set: {exc}") from None


def draft_backends(text: str | None, draft: str, modes: list[str]) -> list[str]:
    """--draft-backends as a list (default: both when llama-cpp-python is installed), checked
    against --draft and --modes before anything starts."""
    available = llama_cpp_available()
    default = ",".join(DRAFT_BACKENDS) if available else "torch"
    backends = list(dict.fromkeys(b.strip() for b in (text or default).split(",") if b.strip()))
    if not backends or any(b not in DRAFT_BACKENDS for b in backends):
        raise ToolError(f"--draft-backends: expected a subset of {','.join(DRAFT_BACKENDS)}, got {text!r}")
    for backend in backends:
        try:
            check_draft_spec(resolve_draft_backend(backend, draft or None, available=available)[1])
        except LoadError as exc:
            raise ToolError(f"--draft-backends {backend}: {exc}") from None
    return backends


def build_parser() -> argparse.ArgumentParser:
    p = scenario_parser("edge-cloud", "Cloud AR vs edge-cloud SD vs early exits over emulated links (two node "
                        "processes).", quick=f"one short prompt, {QUICK_MAX_NEW_TOKENS} tokens",
                        png="plot speedup vs RTT", log=True)
    p.add_argument("--rtt", default=",".join(f"{v:g}" for v in RTTS_MS), help="round-trip times in ms")
    p.add_argument("--bandwidth", default=",".join(f"{v:g}" for v in BANDWIDTHS_MBPS), help="link rates in Mbit/s")
    p.add_argument("--modes", default=",".join(MODES), help=f"comma-separated subset of {','.join(MODES)} (and tree)")
    p.add_argument("--prompts", type=int, default=DEFAULT_PROMPTS, help=f"how many bench prompts (1-{len(BENCH_PROMPTS)})")
    p.add_argument("--max-new-tokens", type=int, default=None, help=f"new tokens per prompt (default {MAX_NEW_TOKENS})")
    p.add_argument("--gamma", type=int, default=4, help="drafted tokens per round (EE uses 4)")
    p.add_argument("--draft", default="", metavar="SPEC",
                   help="draft_node's draft, for every draft backend ('' = the shipped draft, on llama.cpp its GGUF)")
    p.add_argument("--draft-backends", default=None, metavar="LIST",
                   help="draft_node's draft_backend, a deployment each: comma-separated subset of torch,llama.cpp "
                        "(default: both when llama-cpp-python is installed, else torch)")
    p.add_argument("--set", action="append", default=[], metavar="NAME:=VALUE",
                   help="a launch argument for the deployment (repeatable), e.g. min_confidence:=0.3 or "
                        "exit_layers:=16,24")
    p.add_argument("--pin", action="store_true",
                   help="each node on a core of its own, with taskset (default: the nodes share every core)")
    p.add_argument("--simulate", action="store_true",
                   help="also simulate every run (core/sim/edge_cloud.py with costs measured here; error against "
                        "the measured tokens/s) and project EE's regime (Table 5's times); about a minute more")
    return p


def run(args: argparse.Namespace, progress: bool) -> dict:
    """The scenario on the parsed command line (the harness resolved --json, --png and --log); the
    report. ToolError for bad input, before anything starts."""
    rtts, bandwidths = _numbers(args.rtt, "--rtt"), _numbers(args.bandwidth, "--bandwidth")
    if any(b == 0 for b in bandwidths):
        raise ToolError("--bandwidth must be > 0 Mbit/s")
    modes = list(dict.fromkeys(m.strip() for m in args.modes.split(",") if m.strip()))
    unknown = [m for m in modes if m not in (*MODES, "tree")]
    if not modes or unknown:
        raise ToolError(f"--modes: expected a subset of {','.join(MODES)},tree; got {args.modes!r}")
    if not 1 <= args.prompts <= len(BENCH_PROMPTS):
        raise ToolError(f"--prompts must be in 1..{len(BENCH_PROMPTS)}, got {args.prompts}")
    if args.gamma < 1:
        raise ToolError(f"--gamma must be >= 1, got {args.gamma}")
    max_new = args.max_new_tokens or (QUICK_MAX_NEW_TOKENS if args.quick else MAX_NEW_TOKENS)
    if max_new <= 0:
        raise ToolError(f"--max-new-tokens must be > 0, got {max_new}")
    prompts = list(QUICK_PROMPTS[:1]) if args.quick else list(BENCH_PROMPTS[: args.prompts])
    check_launch_args(args.set)
    backends = draft_backends(args.draft_backends, args.draft, modes)
    if args.simulate and (args.set or args.draft or backends[0] != "torch"):
        raise ToolError("--simulate models the default deployment (the shipped torch draft first, exits 16,24, one "
                        "pre-draft worker): drop --set and --draft, and keep torch first in --draft-backends")
    return run_scenario(rtts, bandwidths, prompts, modes, max_new, args.gamma, args.draft, args.log,
                        progress=progress, launch_args=args.set, backends=backends, pin=args.pin,
                        simulate=args.simulate)


SCENARIO = register(Scenario(
    name="edge-cloud", help="draft_node + verifier_node over emulated links: cloud AR, edge-cloud SD, early exits",
    build_parser=build_parser, run=run, format_table=format_table, failures=failures, plot=plot,
    sends_goals=True, writes_log=True,
))
