"""The launched pipeline of ``bench --scenario serving`` and its clients: who asks what
(:func:`schedule`), one goal as a client saw it (:class:`Request`), the launch plan with the
bench's arguments (:func:`pipeline_plan`), and N closed-loop clients in this process on one
deployment, every client count in turn (:func:`node_runs`), ready once the nodes are
lifecycle-active. The scenario (tools/bench_serving.py) decides what runs.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from edge_llm_ros.tools.bench_harness import progress_bar
from edge_llm_ros.tools.deployment import Deployment, EventLog, end_process, local_router, node_backend
from edge_llm_ros.tools.generate import one_line
from edge_llm_ros.tools.loading import ToolError
from edge_llm_ros.tools.prompts import BenchPrompt

WARMUP_TOKENS = 8
START_TIMEOUT_S = 300.0  # model loading
GOAL_TIMEOUT_S = 300.0
NAMESPACE = "/edge_llm"
LAUNCH = "pipeline"
SERVING = r"\[serve_node-\d+\].*serving"  # what serve_node says it serves (for the report)
PLANNER = f"{NAMESPACE}/planner_node"  # active: the device plan is published


# -- who asks what -----------------------------------------------------------------------------------


def schedule(clients: int, per_client: int, prompts: int) -> list[list[int]]:
    """The prompt index of each client's requests: request r of client c asks (r * clients + c) % prompts."""
    return [[(r * clients + c) % prompts for r in range(per_client)] for c in range(clients)]


@dataclass
class Request:
    """One goal as a client saw it (time.monotonic() times)."""

    client: int
    index: int  # its place in the client's sequence
    prompt: int  # index into the prompts
    sent: float = 0.0
    first_token: float | None = None
    done: float | None = None
    tokens: tuple[int, ...] = ()
    status: int | None = None  # its RequestStatus code (edge_llm_ros.errors.Status); None: rejected, or no result
    error: str = ""

    @property
    def wall_s(self) -> float | None:
        return None if self.done is None else self.done - self.sent


# -- the pipeline ------------------------------------------------------------------------------------


class Clients:
    """This process as N applications: one LLMClient (one action client, one feedback subscription)
    shared by the client threads, so feedback is decoded once per message however many clients
    there are."""

    def __init__(self) -> None:
        from edge_llm_ros.client import LLMClient

        self.llm = LLMClient(NAMESPACE, timeout=GOAL_TIMEOUT_S, connect_timeout=60.0, backend=node_backend())

    def wait_ready(self, deployment: Deployment, plan, timeout: float) -> None:
        """Until the generate server's node is lifecycle-active (serve_node; echo_node, the stand-in, once
        it answers) and, with planner_node in the launch, planner_node is active too (its device plan
        published, the calibration over), so no calibration runs during the measurement."""
        deadline = time.monotonic() + timeout
        self.llm.wait_until_ready(timeout, check=deployment.check_alive)
        if "planner_node" in {node.name for node in plan.nodes}:
            self.llm.wait_until_active(PLANNER, timeout, check=deployment.check_alive, deadline=deadline)

    def request(self, request: Request, text: str, max_new_tokens: int) -> Request:
        """Send one greedy goal and wait for its result; times and tokens filled into ``request``."""
        from edge_llm_ros.errors import RequestError

        request.sent = time.monotonic()
        try:
            stream = self.llm.stream(text, max_new_tokens=max_new_tokens, temperature=0.0, seed=0)
            for chunk in stream:
                if request.first_token is None and (chunk.token_ids or chunk.text):
                    request.first_token = chunk.at
            result = stream.result()
        except RequestError as exc:  # refused as busy (no result), or a result that is not an answer
            answer = getattr(exc, "result", None)
            request.error, request.status = one_line(exc), None if answer is None else int(exc.status)
            if answer is not None:
                request.done, request.tokens = stream.ended_at, tuple(answer.token_ids)
            return request
        except Exception as exc:  # no answer in time (NoAnswer), or the call itself failed
            request.error = one_line(exc)
            return request
        request.done, request.status, request.tokens = stream.ended_at, int(result.status), tuple(result.token_ids)
        return request

    def run(self, plan: list[list[int]], prompts: list[BenchPrompt], max_new_tokens: int) -> list[Request]:
        """Every client of ``plan`` as a closed loop on a thread of its own; every request, when all ended."""
        requests = [[Request(c, r, p) for r, p in enumerate(mine)] for c, mine in enumerate(plan)]

        def loop(mine: list[Request]) -> None:
            for request in mine:
                self.request(request, prompts[request.prompt].text, max_new_tokens)

        threads = [threading.Thread(target=loop, args=(mine,), daemon=True, name=f"client-{c}")
                   for c, mine in enumerate(requests)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(GOAL_TIMEOUT_S * len(plan[0]) + 60)
        return [r for mine in requests for r in mine]

    def close(self) -> None:
        self.llm.close()


def pipeline_plan(wanted: list[str], given: list[str]):
    """launch/pipeline.launch.py with ``given`` (each must be a launch argument of it) and those of
    ``wanted`` some node declares; the plan, the arguments applied, and those left out."""
    from edge_llm_ros.runtime.launcher import LaunchError, apply_launch_args, load_plan

    plan = load_plan(LAUNCH)
    declared = plan.launch_arguments()
    given_keys = {a.partition(":=")[0] for a in given}
    applied = [a for a in wanted if a.partition(":=")[0] in declared.keys() - given_keys] + list(given)
    try:
        apply_launch_args(plan, applied)
    except LaunchError as exc:
        raise ToolError(f"--set: {exc}") from None
    return plan, applied, [a for a in wanted if a.partition(":=")[0] not in declared]


def ready_conditions(plan) -> list[str]:
    """What the bench waits for before it measures (Clients.wait_ready), for the report."""
    names = {node.name for node in plan.nodes}
    return [f"{NAMESPACE}/generate answers and its node is lifecycle-active",
            *([f"{PLANNER} is lifecycle-active (its device plan published)"] if "planner_node" in names else [])]


def serving_lines(log: EventLog) -> list[str]:
    """What serve_node said it serves (its "serving" lines), for the report."""
    return [m.string.split("]: ", 1)[-1] for _, m in log.find(SERVING)]


def node_runs(plan, client_counts: list[int], per_client: int, prompts: list[BenchPrompt], max_new_tokens: int,
              log: EventLog, progress: bool, foxglove: int = 0) -> tuple[dict[int, list[Request]], dict | None]:
    """One deployment of the pipeline, every client count in turn (after one untimed request); with
    ``foxglove`` rounds, then the largest count again, without and with a foxglove_bridge_node and a
    client of it on every channel, in turn (:func:`foxglove_pass`)."""
    runs, watched = {}, None
    with local_router("serving-router") as endpoint:
        clients = Clients()
        try:
            with Deployment(plan, endpoint, log, "pipeline") as deployment:
                clients.wait_ready(deployment, plan, START_TIMEOUT_S)
                clients.request(Request(0, 0, 0), prompts[0].text, WARMUP_TOKENS)
                with progress_bar(sum(n * per_client for n in client_counts), "serving", "request", progress) as bar:
                    for n in client_counts:
                        bar.set_postfix_str(f"{n} clients")
                        runs[n] = clients.run(schedule(n, per_client, len(prompts)), prompts, max_new_tokens)
                        deployment.check_alive()
                        bar.update(n * per_client)
                if foxglove:
                    watched = foxglove_pass(endpoint, clients, max(client_counts), per_client, prompts,
                                            max_new_tokens, log, foxglove)
                    deployment.check_alive()
        finally:
            clients.close()
    return runs, watched


def foxglove_pass(endpoint: str, clients: Clients, n: int, per_client: int, prompts: list[BenchPrompt],
                  max_new_tokens: int, log: EventLog, rounds: int) -> dict:
    """The ``n``-client load again, ``rounds`` times two passes in turn: one without a bridge, one with a
    foxglove_bridge_node serving the graph (started for it) and a Foxglove client
    (tools/foxglove_watch.py) subscribed to every channel. Taking turns keeps the machine's drift
    out of the ratio. Each pass's requests, what the client received, the bridge's CPU seconds."""
    plain, bridged = [], []
    for _ in range(rounds):
        plain.append(clients.run(schedule(n, per_client, len(prompts)), prompts, max_new_tokens))
        bridged.append(bridged_pass(endpoint, clients, n, per_client, prompts, max_new_tokens, log))
    return {"clients": n, "plain": plain, "bridged": bridged}


def bridged_pass(endpoint: str, clients: Clients, n: int, per_client: int, prompts: list[BenchPrompt],
                 max_new_tokens: int, log: EventLog) -> dict:
    """One pass with a foxglove_bridge_node and a client on every channel (see :func:`foxglove_pass`)."""
    import os
    import subprocess
    import sys

    from edge_llm_ros.runtime.router import ENDPOINT_ENV, free_endpoint, router_reachable
    from edge_llm_ros.tools.foxglove_watch import FoxgloveWatcher
    from edge_llm_ros.tools.pipeline_deployment import cpu_seconds

    port = int(free_endpoint().rsplit(":", 1)[1])
    bridge = subprocess.Popen([sys.executable, "-m", "edge_llm_ros.nodes.foxglove_bridge_node", "--ros-args",
                               "-r", f"__ns:={NAMESPACE}", "-p", f"port:={port}"], env={**os.environ, ENDPOINT_ENV: endpoint},
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    threading.Thread(target=lambda: [log.write(f"[foxglove_bridge] {line}") for line in bridge.stdout], daemon=True,
                     name="foxglove-bridge-log").start()
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not router_reachable(f"tcp/127.0.0.1:{port}", timeout=0.5):  # the WebSocket server is up
            if bridge.poll() is not None or time.monotonic() > deadline:
                raise ToolError(f"foxglove_bridge_node did not serve on port {port} (exit {bridge.poll()}); "
                                f"its last lines:\n{log.tail()}")
            time.sleep(0.2)
        with FoxgloveWatcher(f"ws://127.0.0.1:{port}") as watcher:
            time.sleep(2.0)  # the subscriptions reach the bridge and its ROS subscriptions match
            cpu_before, started = cpu_seconds(bridge.pid), time.perf_counter()
            requests = clients.run(schedule(n, per_client, len(prompts)), prompts, max_new_tokens)
            wall, cpu = time.perf_counter() - started, cpu_seconds(bridge.pid) - cpu_before
            if watcher.error is not None:
                raise ToolError(f"the Foxglove client failed: {watcher.error}")
            return {"requests": requests, "channels": len(watcher.channels), "messages": watcher.messages,
                    "bytes": watcher.bytes, "bridge_cpu_s": cpu, "wall_s": wall}
    finally:
        end_process(bridge)
