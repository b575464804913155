"""``edge-llm-ros bench --scenario reliability``: fuzz, overload and faults against the launched
edge-cloud deployment, as a hostile user and a busy fleet would.

    edge-llm-ros bench --scenario reliability --json rel.json
    edge-llm-ros bench --scenario reliability --messages 2000 --goals 12 --quick

One deployment of ``launch/edge_cloud.launch.py`` (verifier_node and draft_node as processes, the
embedded launcher on a thread of this process, its own Zenoh router), this process as the fleet:

1. **fuzz**: a goal is running while ``--messages`` seeded fuzz messages (tools/fuzz.py) go raw
   onto every topic the nodes subscribe to. Every DraftTree that breaks the contract must come
   back as a VerifyResult whose error names the field (or says busy); every instruction gets a
   final TokenChunk; the running goal must still return the target's exact greedy text. RSS of
   both nodes is read before (after a warm-up of as many concurrent goals as draft_node's
   max_requests and a first burst of 1,000 fuzz messages: the working set of a full node and
   the buffers a burst touches once) and after (the fuzz's requests expired), each time once the
   deployment is quiet and a malloc-trim period has passed.
2. **overload**: ``--goals`` concurrent goals from ``--clients`` action clients, more than the
   nodes' ``max_requests``: the extra ones are refused as busy at once, the accepted ones all
   return their exact greedy text.
3. **faults**: each peer (verifier_node, draft_node, the Zenoh router) is killed (SIGKILL) in
   turn while a goal runs. That goal must end (never hang); the launcher respawns the node
   (restarts the router); ``recovery_s`` is the time from the kill to the next goal that returns
   the exact greedy text, against each node's own start time.

The fleet (this process's clients, tools/reliability_fleet.py) waits for readiness on the nodes'
lifecycle state and times each node's start from the launcher's line to its transition to active.

The report (JSON, and a table): messages sent, crashes (a node died that nobody killed), hangs
(a goal that did not end within its deadline), RSS before/after, live requests lost (accepted
goals that failed or were not exact without a fault), goals refused as busy, recovery times.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from edge_llm_ros.tools.bench_harness import Scenario, machine_info, register, scenario_parser, utc_now
from edge_llm_ros.tools.deployment import Deployment, EventLog, environment
from edge_llm_ros.tools.fuzz import Fuzzer
from edge_llm_ros.tools.loading import ToolError
from edge_llm_ros.tools.reliability_fleet import (
    PEERS,
    START_TIMEOUT_S,
    Fleet,
    References,
    exact,
    output,
)

ROUTER = "zenoh_router"
PROMPTS = ("Name three colors.", "Describe how a robot should explore a new house.",
           "Write a short poem about the sea.", "Give three tips for charging a battery safely.")
LIVE_TOKENS = 64  # the goal that runs through the fuzz, and through each fault
WARM_GOALS = 8  # draft_node's max_requests: RSS "before" is taken with every slot used once ...
WARM_MESSAGES = 1000  # ... and after a first burst of fuzz (another seed)
TRIM_PERIOD_S = 2.0  # the nodes' heap trim period here: settled RSS is read one period after a quiet goal
TARGETS = {"crashes": 0, "hangs": 0, "live_requests_lost": 0, "rss_growth_mb": 50.0,
           "recovery_over_start_time": 2.0,  # the verifier's (the target); the others are reported
           "messages": 10_000, "concurrent_goals": 30}
# Launch arguments of the deployment under test: short timeouts so faults show quickly.
# max_new_tokens: what an instruction (a fuzzed one too) gets; goals set their own (MAX_NEW_TOKENS, LIVE_TOKENS)
NODE_ARGS = ("timeout_s:=8.0", "idle_timeout_s:=5.0", "threads:=1", "stats_period_s:=0.0", "max_new_tokens:=16")


def edge_cloud_plan(launch_args: list[str] = ()):
    """launch/edge_cloud.launch.py with the suite's short timeouts (NODE_ARGS) and ``launch_args``."""
    from edge_llm_ros.runtime.launcher import apply_launch_args, load_plan

    plan = load_plan("edge_cloud")
    apply_launch_args(plan, [*NODE_ARGS, *launch_args])
    return plan


def start_time_s(log: EventLog, fleet: Fleet, name: str, since: float = 0.0) -> float:
    """Seconds from the launcher starting ``name`` (its line) to the node becoming lifecycle-active (its
    transition event, as the fleet heard it: models loaded, serving)."""
    started, _ = log.wait_for(rf"\[launcher\] started {name} \(pid \d+\)", START_TIMEOUT_S, since)
    return fleet.activated(name, started, START_TIMEOUT_S) - started


# -- the three phases ----------------------------------------------------------------------------------


@dataclass
class Burst:
    """What one burst of fuzz owes: answers to refused DraftTrees (id -> the field the error names,
    or "answer") and final TokenChunks to the instructions that deserialize."""

    sent: int = 0
    publish_s: float = 0.0
    owed: dict[str, str] = field(default_factory=dict)
    instructions: int = 0


def fuzz_burst(fleet: Fleet, seed: int, messages: int) -> Burst:
    """Publish ``messages`` seeded fuzz messages as fast as the transport takes them."""
    from edge_llm_ros.runtime.interfaces import registry

    burst, started = Burst(), time.monotonic()
    for msg in Fuzzer(seed).messages(messages):
        fleet.publish_raw(msg.topic, msg.data)
        burst.sent += 1
        if msg.expect and msg.kind in ("invalid", "valid"):
            burst.owed[msg.request_id] = msg.expect
        if msg.topic == "instruction":
            try:  # a mutated or cut one that still deserializes is an instruction too
                registry().deserialize(msg.data, msg.ros_type)
                burst.instructions += 1
            except Exception:
                pass
    burst.publish_s = time.monotonic() - started
    return burst


def await_answers(fleet: Fleet, burst: Burst, done_before: int, timeout: float) -> bool:
    """Until every refused DraftTree and every instruction of ``burst`` has its answer."""
    deadline = time.monotonic() + timeout
    while not (set(burst.owed) <= fleet.answered and fleet.done_chunks - done_before >= burst.instructions):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def settled_rss(deployment: Deployment, fleet: Fleet, references: References, deadline_s: float) -> dict:
    """Each node's RSS once the deployment is quiet: a goal served exactly (the fuzz's requests
    expired from the verifier), then one malloc-trim period (nodes/common.py) later."""
    from edge_llm_ros.nodes.common import trim_period_s

    goal, deadline = fleet.generate(PROMPTS[0], deadline_s), time.monotonic() + 2 * deadline_s
    while not exact(goal, references) and time.monotonic() < deadline:  # the verifier is full of fuzz requests
        goal = fleet.generate(PROMPTS[0], deadline_s)
    if not exact(goal, references):
        raise ToolError(f"no exact goal after the fuzz: {goal}")
    time.sleep(trim_period_s() + 1.0)
    return {name: deployment.rss_mb(name) for name in PEERS}


def fuzz_phase(deployment: Deployment, fleet: Fleet, references: References, messages: int, seed: int,
               goal_deadline_s: float) -> dict:
    """A warm-up burst (first-touch memory: zenoh's buffers, the allocator's high-water), RSS
    before; then a live goal with ``messages`` fuzz messages while it runs, and: the goal exact,
    every refused DraftTree answered with the field at fault, every instruction answered, RSS after."""
    rss_start = {name: deployment.rss_mb(name) for name in PEERS}
    done = fleet.done_chunks
    warm = fuzz_burst(fleet, seed + 1, WARM_MESSAGES)
    await_answers(fleet, warm, done, goal_deadline_s * 4)
    rss_before = settled_rss(deployment, fleet, references, goal_deadline_s)
    done = fleet.done_chunks
    live = fleet.send(PROMPTS[1], goal_deadline_s, max_new_tokens=LIVE_TOKENS)
    if not live.accepted:
        raise ToolError(f"the live goal of the fuzz phase was not taken: {live.error or 'busy'}")
    live.first_feedback.wait(goal_deadline_s)
    burst = fuzz_burst(fleet, seed, messages)
    Fleet.finish(live, goal_deadline_s)
    await_answers(fleet, burst, done, goal_deadline_s * 4)
    unanswered = [rid for rid in burst.owed if rid not in fleet.answered]
    wrong = {rid[:40]: [e[:120] for e in fleet.errors.get(rid, [])] for rid, expect in burst.owed.items()
             if expect != "answer" and rid in fleet.answered
             and not any(e.startswith((f"{expect}:", "busy:")) for e in fleet.errors.get(rid, []))}
    instruction_answers = fleet.done_chunks - done
    rss_after = settled_rss(deployment, fleet, references, goal_deadline_s)
    return {
        "messages": burst.sent,
        "warm_up_messages": warm.sent,
        "publish_s": burst.publish_s,
        "live_goal_exact": exact(live, references),
        "live_goal": {**output(live), "reason": live.reason, "error": live.error},
        "owed_answers": len(burst.owed),
        "unanswered": len(unanswered),
        "wrong_errors": wrong,
        "instructions": burst.instructions,
        "instruction_answers": instruction_answers,
        "rss_start_mb": rss_start,
        "rss_before_mb": rss_before,
        "rss_after_mb": rss_after,
        "rss_growth_mb": max(rss_after[n] - rss_before[n] for n in PEERS),
    }


def overload_phase(fleet: Fleet, references: References, goals: int, goal_deadline_s: float) -> dict:
    """``goals`` goals at once from every client: the extra ones refused as busy, the others exact."""
    sent: list = [None] * goals

    def one(i: int) -> None:
        sent[i] = fleet.send(PROMPTS[i % len(PROMPTS)], goal_deadline_s, client=i)

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(goals)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    runs = [Fleet.finish(run, goal_deadline_s) for run in sent]
    accepted = [r for r in runs if r.accepted]
    return {
        "goals": goals,
        "clients": len(fleet.clients),
        "accepted": len(accepted),
        "refused_busy": sum(not r.accepted and not r.error for r in runs),
        "unsent": [r.error for r in runs if r.error and not r.accepted],
        "exact": sum(exact(r, references) for r in accepted),
        "hangs": sum(r.hung for r in accepted),
        "failed": [{"status": r.status, "reason": r.reason, "error": r.error} for r in accepted
                   if not exact(r, references)],
        "outputs": [output(r) for r in accepted],
        "max_wall_s": max((r.wall_s for r in accepted), default=0.0),
    }


def fault_phase(deployment: Deployment, fleet: Fleet, references: References, name: str,
                goal_deadline_s: float, recovery_deadline_s: float) -> dict:
    """Kill ``name`` while a goal runs; that goal must end; then time until a goal is exact again."""
    run = fleet.send(PROMPTS[1], goal_deadline_s, max_new_tokens=LIVE_TOKENS)
    if run.accepted:
        run.first_feedback.wait(goal_deadline_s)
    killed_at = deployment.kill(name)
    Fleet.finish(run, goal_deadline_s)
    attempts, recovered_at, last = 0, None, None
    while time.monotonic() - killed_at < recovery_deadline_s:
        fleet.wait_ready(deployment, recovery_deadline_s)  # the action server and both subscriptions are back
        attempts += 1
        last = fleet.generate(PROMPTS[0], goal_deadline_s)
        if exact(last, references):
            recovered_at = time.monotonic()
            break
        if not deployment.alive():
            break
        time.sleep(0.25)  # a failed attempt (node still starting): try again
    restart_s = start_time_s(deployment.log, fleet, name, killed_at) if name != ROUTER else None
    return {
        "killed": name,
        "goal_in_flight": {"status": run.status, "reason": run.reason, "error": run.error, "ended": not run.hung},
        "recovery_s": None if recovered_at is None else recovered_at - killed_at,
        "restart_s": restart_s,
        "attempts": attempts,
        "last": {**(output(last) if last else {"status": None}), "reason": last.reason if last else "",
                 "error": last.error if last else ""},
    }


def run_reliability(messages: int, goals: int, clients: int, seed: int, log_path: Path | None,
                    faults: tuple[str, ...] = (*PEERS, ROUTER), launch_args: list[str] = ()) -> dict:
    from edge_llm_ros.nodes.common import TRIM_PERIOD_ENV
    from edge_llm_ros.runtime.router import ENDPOINT_ENV, free_endpoint

    endpoint = free_endpoint()  # this process's session and the nodes meet at the launcher's router
    nodes_env = {ENDPOINT_ENV: endpoint,
                 TRIM_PERIOD_ENV: os.environ.get(TRIM_PERIOD_ENV, str(TRIM_PERIOD_S))}  # heaps trimmed this often
    log, references = EventLog(log_path), References()
    started = time.perf_counter()
    goal_deadline_s = 60.0
    phases: dict[str, float] = {}
    mark = [time.perf_counter()]

    def phase(name: str) -> None:
        now = time.perf_counter()
        phases[name] = round(now - mark[0], 2)
        mark[0] = now
        print(f"[reliability] {name}: {phases[name]:.1f} s", file=sys.stderr, flush=True)

    with environment(**nodes_env), Deployment(edge_cloud_plan(launch_args), endpoint, log) as deployment:
        fleet = Fleet(clients)  # at once: it hears each node's transition to active (the start times)
        try:
            start = {name: start_time_s(log, fleet, name) for name in PEERS}
            fleet.wait_ready(deployment)
            phase("start")
            for prompt in PROMPTS:
                references(prompt)
            references(PROMPTS[1], LIVE_TOKENS)
            phase("references")
            warm = overload_phase(fleet, references, WARM_GOALS, goal_deadline_s)  # every slot busy once
            if warm["exact"] != warm["accepted"] or not warm["accepted"]:
                raise ToolError(f"the warm-up goals were not the target's greedy output: {warm}")
            phase("warm-up goals")
            fuzz = fuzz_phase(deployment, fleet, references, messages, seed, goal_deadline_s)
            phase("fuzz")
            overload = overload_phase(fleet, references, goals, goal_deadline_s)
            phase("overload")
            fault_runs = {}
            for name in faults:
                fault_runs[name] = fault_phase(deployment, fleet, references, name, goal_deadline_s,
                                               max(60.0, 4 * max(start.values())))
                phase(f"kill {name}")
            crashes = deployment.crashes()
        finally:
            fleet.close()
    log.close()
    hangs = overload["hangs"] + sum(not f["goal_in_flight"]["ended"] for f in fault_runs.values())
    lost = (not fuzz["live_goal_exact"]) + len(overload["failed"])
    return {
        "scenario": "reliability",
        "label": "emulated link",
        "date": utc_now(),
        "machine": machine_info(),
        "deployment": {"launch": "edge_cloud", "launch_arguments": [*NODE_ARGS, *launch_args], "seed": seed},
        "messages": fuzz["messages"],
        "crashes": len(crashes),
        "crash_lines": crashes,
        "hangs": hangs,
        "rss_start_mb": fuzz["rss_start_mb"],
        "rss_before_mb": fuzz["rss_before_mb"],
        "rss_after_mb": fuzz["rss_after_mb"],
        "rss_growth_mb": fuzz["rss_growth_mb"],
        "live_requests_lost": lost,
        "refused_busy": overload["refused_busy"],
        "start_s": start,
        "recovery_s": {name: f["recovery_s"] for name, f in fault_runs.items()},
        "recovery_over_start_time": {name: f["recovery_s"] / start[name] for name, f in fault_runs.items()
                                     if f["recovery_s"] is not None and name in start},
        "fuzz": fuzz,
        "overload": overload,
        "faults": fault_runs,
        "targets": TARGETS,
        "phase_s": phases,
        "wall_s": time.perf_counter() - started,
    }


# -- output and command line -------------------------------------------------------------------------


def format_table(report: dict) -> str:
    fuzz, overload = report["fuzz"], report["overload"]
    lines = [
        f"reliability ({report['label']}): edge_cloud deployment, seed {report['deployment']['seed']}",
        f"  fuzz        {report['messages']} messages in {fuzz['publish_s']:.1f} s; live goal exact: "
        f"{fuzz['live_goal_exact']}; refusals answered {fuzz['owed_answers'] - fuzz['unanswered']}/"
        f"{fuzz['owed_answers']} ({len(fuzz['wrong_errors'])} naming the wrong field); instructions answered "
        f"{fuzz['instruction_answers']}/{fuzz['instructions']}",
        "  rss MiB     " + ", ".join(f"{n} {report['rss_before_mb'][n]:.0f} -> {report['rss_after_mb'][n]:.0f}"
                                   for n in report["rss_before_mb"]) + f" (growth {report['rss_growth_mb']:.1f})",
        f"  overload    {overload['goals']} goals from {overload['clients']} clients: {overload['accepted']} accepted "
        f"({overload['exact']} exact), {overload['refused_busy']} refused as busy",
    ]
    for name, fault in report["faults"].items():
        recovery = fault["recovery_s"]
        start = report["start_s"].get(name)
        lines.append(f"  kill {name:<14} goal in flight: {fault['goal_in_flight']['reason'] or fault['goal_in_flight']['error'] or fault['goal_in_flight']['status']}; "
                     f"recovered in {'-' if recovery is None else f'{recovery:.1f} s'}"
                     + (f" (start time {start:.1f} s)" if start else ""))
    lines.append(f"  crashes {report['crashes']}, hangs {report['hangs']}, live requests lost "
                 f"{report['live_requests_lost']}")
    return "\n".join(lines)


def failures(report: dict) -> list[str]:
    """A "target missed" line per target of the issue the report misses (empty: every target met)."""
    out = []
    for key in ("crashes", "hangs", "live_requests_lost"):
        if report[key]:
            out.append(f"{key}: {report[key]} (target 0)")
    if report["rss_growth_mb"] > TARGETS["rss_growth_mb"]:
        out.append(f"rss_growth_mb: {report['rss_growth_mb']:.1f} (target < {TARGETS['rss_growth_mb']:g})")
    for name, recovery in report["recovery_s"].items():
        start = report["start_s"].get(name)
        if recovery is None:
            out.append(f"recovery after killing {name}: none")
        elif name == "verifier_node" and recovery > TARGETS["recovery_over_start_time"] * start:
            out.append(f"recovery after killing {name}: {recovery:.1f} s > 2 x its start time {start:.1f} s")
    return [f"target missed: {line}" for line in out]


def build_parser() -> argparse.ArgumentParser:
    p = scenario_parser("reliability", "Fuzz, overload and kill the edge-cloud deployment; report crashes, hangs, "
                        "memory, recovery.", quick="2000 messages, 12 goals", log=True)
    p.add_argument("--messages", type=int, default=10_000, help="fuzz messages (default %(default)s)")
    p.add_argument("--goals", type=int, default=30, help="concurrent goals in the overload phase (default %(default)s)")
    p.add_argument("--clients", type=int, default=3, help="action clients the goals come from (default %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="fuzz seed (default %(default)s)")
    p.add_argument("--faults", default=",".join((*PEERS, ROUTER)),
                   help="processes to kill, comma-separated (default %(default)s; '' for none)")
    p.add_argument("--set", action="append", default=[], metavar="NAME:=VALUE",
                   help="a launch argument for the deployment (repeatable)")
    return p


def run(args: argparse.Namespace, progress: bool) -> dict:
    """The suite on the parsed command line (the harness resolved --json and --log); the report.
    ToolError for bad input, before anything starts."""
    messages, goals = (2000, 12) if args.quick else (args.messages, args.goals)
    for name, value, low in (("--messages", messages, 0), ("--goals", goals, 1), ("--clients", args.clients, 1)):
        if value < low:
            raise ToolError(f"{name} must be >= {low}, got {value}")
    faults = tuple(f.strip() for f in args.faults.split(",") if f.strip())
    unknown = [f for f in faults if f not in (*PEERS, ROUTER)]
    if unknown:
        raise ToolError(f"--faults: unknown process {unknown[0]!r}; expected some of {', '.join((*PEERS, ROUTER))}")
    return run_reliability(messages, goals, args.clients, args.seed, args.log, faults, args.set)


SCENARIO = register(Scenario(
    name="reliability", help="fuzz, overload and faults against the edge-cloud deployment: crashes, hangs, memory, "
                             "recovery",
    build_parser=build_parser, run=run, format_table=format_table, failures=failures, verdict=None,
    sends_goals=True, writes_log=True,
))
