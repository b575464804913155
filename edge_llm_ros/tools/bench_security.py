"""``edge-llm-ros bench --scenario security``: what mutual TLS and the router's access control cost,
secured against unsecured, in one run.

    edge-llm-ros bench --scenario security --json security.json
    edge-llm-ros bench --scenario security --quick          # one round, fewer tokens: a smoke check

Two parts, each with two deployments alive side by side: one as always (a plain router on loopback),
one with a keystore made here from its shipped policy (``keystore:=``: the router on ``tls/`` with
mutual TLS and every enclave's rules, each node in its enclave; runtime/security.py). This process
is the operator's application: for the secured deployment it joins as the ``/operator`` enclave (its
session config from the keystore). Passes take turns, plain then secured, ``--rounds`` times, so the
machine's drift falls on both alike.

    edge-cloud   launch/edge_cloud.launch.py on loopback, no emulated link (latency 0): draft_node
                 (torch draft) and verifier_node; each prompt as an ``sd`` goal; the round time is
                 the goals' wall time over their rounds (tokens / tau). No emulated link, so the
                 link's share of a round, which mTLS adds to, is the largest it can be here.
    serving      launch/pipeline.launch.py (planner, serve_node, monitor); CLIENTS clients in closed
                 loops, PER_CLIENT greedy requests each; aggregate tokens/s over the pass.

Each secured answer must be token-identical to the plain one (the verdict). Targets (issue 30):
the secured round time within 5% of the plain one, and secured tokens/s at least 95% of plain.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from contextlib import ExitStack, contextmanager
from pathlib import Path

from edge_llm_ros.tools.bench_harness import (
    Scenario,
    fmt_value,
    machine_info,
    progress_bar,
    register,
    scenario_parser,
    utc_now,
)
from edge_llm_ros.tools.deployment import Deployment, EventLog, environment
from edge_llm_ros.tools.loading import ToolError
from edge_llm_ros.tools.prompts import BENCH_PROMPTS, QUICK_PROMPTS

ROUNDS, QUICK_ROUNDS = 3, 1
MAX_NEW_TOKENS, QUICK_MAX_NEW_TOKENS = 48, 16
CLIENTS, PER_CLIENT = 4, 2
MAX_ROUND_TIME_RATIO = 1.05  # secured / plain edge-cloud round time
MIN_TOKENS_RATIO = 0.95  # secured / plain serving tokens/s
POLICIES = Path(__file__).resolve().parents[2] / "config" / "security"
EDGE_CLOUD_ARGS = ["threads:=1", "gamma:=4", "timeout_s:=120.0", "stats_period_s:=0.0", "draft_backend:=torch"]


@contextmanager
def joined(endpoint: str, session_config: Path | None = None):
    """This process's sessions at ``endpoint`` (as the enclave of ``session_config``, when given) until
    the block is left; then its runtime is shut down, so the next pass opens a session of its own."""
    from edge_llm_ros.runtime import embedded
    from edge_llm_ros.runtime.router import ENDPOINT_ENV
    from edge_llm_ros.runtime.security import SESSION_CONFIG_ENV

    changes = {ENDPOINT_ENV: endpoint, **({SESSION_CONFIG_ENV: str(session_config)} if session_config else {})}
    with environment(**changes):
        try:
            yield
        finally:
            embedded.shutdown()


def edge_cloud_pass(prompts, max_new: int) -> dict:
    from edge_llm_ros.tools.bench_edge_cloud import Client

    client = Client()
    try:
        client.llm.wait_until_ready(120.0)
        goals = [client.generate(p.text, "sd", max_new) for p in prompts]
    finally:
        client.close()
    rounds = sum(len(g.tokens) / g.stats.tau for g in goals if g.stats.tau > 0)
    wall = sum(g.wall_s for g in goals)
    return {"round_ms": 1000 * wall / rounds if rounds else None, "tokens": [list(g.tokens) for g in goals],
            "wall_s": wall}


def serving_pass(prompts, max_new: int, clients: int, per_client: int) -> dict:
    from edge_llm_ros.tools.serving_deployment import Clients, schedule

    users = Clients()
    try:
        users.llm.wait_until_ready(120.0)
        started = time.perf_counter()
        requests = users.run(schedule(clients, per_client, len(prompts)), prompts, max_new)
        wall = time.perf_counter() - started
    finally:
        users.close()
    failed = [r.error or f"status {r.status}" for r in requests if r.done is None or r.error]
    if failed:
        raise ToolError(f"serving requests failed: {failed[:3]}")
    tokens = sum(len(r.tokens) for r in requests)
    return {"tokens_per_s": tokens / wall, "tokens": {f"{r.client}.{r.index}": list(r.tokens) for r in requests},
            "wall_s": wall}


def run_part(name: str, plan_of, policy: Path, rounds: int, one_pass, keystore_root: Path, log: EventLog,
             bar, ready) -> dict:
    """Both deployments of one part side by side; ``rounds`` turns of (plain pass, secured pass)."""
    from edge_llm_ros.runtime.router import free_endpoint, router_reachable
    from edge_llm_ros.runtime.security import create_keystore

    store = create_keystore(keystore_root / name, policy, domain_id=int(os.environ.get("ROS_DOMAIN_ID", "0")))
    # each launch starts its router as a process of its own (none in this process, where the clients'
    # threads would share its interpreter), the plain one on tcp/, the secured one on tls/
    plain_endpoint, secured_endpoint = free_endpoint(), "tls/" + free_endpoint().partition("/")[2]
    passes = {"plain": [], "secured": []}
    with ExitStack() as running:
        arms = []
        # one at a time, each loaded and answering (untimed) before the next starts: the second finds the
        # device plan the first one's planner saved, so both serve the same plan
        for arm, plan, endpoint, config in (("plain", plan_of([]), plain_endpoint, None),
                                            ("secured", plan_of([f"keystore:={store.root}"]), secured_endpoint,
                                             store.session_config("/operator"))):
            deployment = running.enter_context(Deployment(plan, endpoint, log, f"{name} ({arm})"))
            deadline = time.monotonic() + 30.0
            while not router_reachable(endpoint, timeout=0.2):  # each launch starts its own router
                deployment.check_alive()
                if time.monotonic() > deadline:
                    raise ToolError(f"no router at {endpoint} after 30 s; last lines:\n{log.tail()}")
                time.sleep(0.1)
            with joined(endpoint, config):
                ready(deployment, plan)
            arms.append((arm, deployment, endpoint, config))
        for _ in range(rounds):
            for arm, deployment, endpoint, config in arms:
                with joined(endpoint, config):
                    passes[arm].append(one_pass())
                deployment.check_alive()
                bar.update(1)
    return passes


def run(args: argparse.Namespace, progress: bool) -> dict:
    from edge_llm_ros.runtime.launcher import apply_launch_args, load_plan
    from edge_llm_ros.tools.bench_edge_cloud import edge_cloud_plan

    rounds = args.rounds if args.rounds is not None else (QUICK_ROUNDS if args.quick else ROUNDS)
    max_new = QUICK_MAX_NEW_TOKENS if args.quick else MAX_NEW_TOKENS
    if rounds < 1:
        raise ToolError(f"--rounds must be >= 1, got {rounds}")
    prompts = list(QUICK_PROMPTS if args.quick else BENCH_PROMPTS[:3])
    log = EventLog(args.log)

    def edge_cloud_of(extra: list[str]):
        return edge_cloud_plan(0.0, 100_000.0, [*EDGE_CLOUD_ARGS, *extra])

    def pipeline_of(extra: list[str]):
        plan = load_plan("pipeline")
        apply_launch_args(plan, extra)
        return plan

    def warm_edge_cloud(deployment, plan):
        from edge_llm_ros.tools.bench_edge_cloud import START_TIMEOUT_S, Client

        client = Client()
        try:
            client.wait_ready(deployment, START_TIMEOUT_S)
        finally:
            client.close()
        edge_cloud_pass(prompts[:1], 8)

    def warm_serving(deployment, plan):
        from edge_llm_ros.tools.serving_deployment import START_TIMEOUT_S, Clients

        users = Clients()
        try:
            users.wait_ready(deployment, plan, START_TIMEOUT_S)
        finally:
            users.close()
        serving_pass(prompts[:1], 8, 1, 1)

    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="edge-llm-ros-keystores-") as tmp, \
            progress_bar(2 * 2 * rounds, "security", "pass", progress) as bar:
        try:
            edge = run_part("edge_cloud", edge_cloud_of, POLICIES / "edge_cloud.xml", rounds,
                            lambda: edge_cloud_pass(prompts, max_new), Path(tmp), log, bar, warm_edge_cloud)
            serving = run_part("pipeline", pipeline_of, POLICIES / "pipeline.xml", rounds,
                               lambda: serving_pass(prompts, max_new, CLIENTS, PER_CLIENT), Path(tmp), log, bar,
                               warm_serving)
        finally:
            log.close()
    round_ms = {arm: statistics.median(p["round_ms"] for p in edge[arm]) for arm in edge}
    tok_s = {arm: statistics.mean(p["tokens_per_s"] for p in serving[arm]) for arm in serving}
    same = (all(p["tokens"] == edge["plain"][0]["tokens"] for arm in edge for p in edge[arm])
            and all(p["tokens"] == serving["plain"][0]["tokens"] for arm in serving for p in serving[arm]))
    return {
        "scenario": "security",
        "date": utc_now(),
        "machine": machine_info(),
        "rounds": rounds,
        "max_new_tokens": max_new,
        "prompts": [p.name for p in prompts],
        "edge_cloud": {"round_ms": round_ms, "ratio": round_ms["secured"] / round_ms["plain"],
                       "passes": {arm: [p["round_ms"] for p in edge[arm]] for arm in edge}},
        "serving": {"clients": CLIENTS, "per_client": PER_CLIENT, "tokens_per_s": tok_s,
                    "ratio": tok_s["secured"] / tok_s["plain"],
                    "passes": {arm: [p["tokens_per_s"] for p in serving[arm]] for arm in serving}},
        "targets": {"max_round_time_ratio": MAX_ROUND_TIME_RATIO, "min_tokens_per_s_ratio": MIN_TOKENS_RATIO},
        "identical": same,
        "wall_s": time.perf_counter() - started,
        "notes": ["plain and secured deployments side by side, passes in turn (plain, secured) each round",
                  "edge-cloud: sd goals, no emulated link; round_ms = median over passes of wall / (tokens / tau)",
                  "serving: the pipeline launch, closed-loop clients; tokens_per_s = mean over passes",
                  "secured: keystore:= from config/security/<launch>.xml; this process joins as /operator"],
    }


def format_table(report: dict) -> str:
    edge, serving = report["edge_cloud"], report["serving"]
    return "\n".join([
        f"security: plain vs secured (mutual TLS, access control), {report['rounds']} round(s), same run",
        f"  edge-cloud round time (sd, loopback): plain {fmt_value(edge['round_ms']['plain'], '.1f')} ms, "
        f"secured {fmt_value(edge['round_ms']['secured'], '.1f')} ms: ratio {edge['ratio']:.3f} "
        f"(target <= {MAX_ROUND_TIME_RATIO})",
        f"  serving ({serving['clients']} clients): plain {serving['tokens_per_s']['plain']:.1f} tok/s, secured "
        f"{serving['tokens_per_s']['secured']:.1f} tok/s: ratio {serving['ratio']:.3f} (target >= {MIN_TOKENS_RATIO})",
        f"  secured answers identical to plain: {report['identical']}"])


def failures(report: dict) -> list[str]:
    out = []
    if report["edge_cloud"]["ratio"] > MAX_ROUND_TIME_RATIO:
        out.append(f"edge-cloud round time ratio {report['edge_cloud']['ratio']:.3f} > {MAX_ROUND_TIME_RATIO}")
    if report["serving"]["ratio"] < MIN_TOKENS_RATIO:
        out.append(f"serving tokens/s ratio {report['serving']['ratio']:.3f} < {MIN_TOKENS_RATIO}")
    return out


def build_parser() -> argparse.ArgumentParser:
    p = scenario_parser("security", __doc__.splitlines()[0].split(": ", 1)[1],
                        quick="one round, fewer tokens", log=True)
    p.add_argument("--rounds", type=int, default=None,
                   help=f"turns of (plain pass, secured pass) per part (default {ROUNDS}; --quick {QUICK_ROUNDS})")
    return p


SCENARIO = register(Scenario(
    name="security", help="mutual TLS and access control against plain links: edge-cloud round time, serving tok/s",
    build_parser=build_parser, run=run, format_table=format_table, failures=failures, verdict="identical",
    sends_goals=True, writes_log=True,
))
