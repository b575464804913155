"""The launched stage pipeline of ``bench --scenario pipeline``, measured from this process: the
launch plan (launch/stages.launch.py, each stage pinned to a core, D0 on the first stage's core),
the Generate client that times every goal's feedback and reads draft_node's ALT / ALR line, the
stages' own `profile` answers, the CPU other processes took meanwhile, and one deployment's run
(:func:`run_deployment`). The scenario (tools/bench_pipeline.py) decides what runs where.
"""

from __future__ import annotations

import os
import re
import shutil
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from edge_llm_ros.tools.bench import CpuShare
from edge_llm_ros.tools.deployment import Deployment, EventLog, ask_profile
from edge_llm_ros.tools.loading import ToolError
from edge_llm_ros.tools.prompts import BenchPrompt

WIRE_BYTES = 4  # hidden states cross as float32 (config/stages.yaml wire_dtype)


STAGE_PROFILE_ROWS, STAGE_PROFILE_CACHED = (1, 8, 24), 64  # what each stage measures of itself (a decode step's sizes)
TTFT_REPEATS = 3
SEGMENT = 8  # draft rows per FlowSpec segment (draft_node's default)
WARMUP_TOKENS = 8
START_TIMEOUT_S = 300.0
GOAL_TIMEOUT_S = 300.0
STATUS_SUCCEEDED = 4
STATS_LINE = (r"\[draft_node-\d+\].*: request \w+ \((\w+)\): (\d+) tokens, ALT ([\d.]+), ALR ([\d.]+); "
              r"D0 drafted (\d+) times, (\d+) forwards, ([\d.]+) s (CPU|wall)")


@dataclass(frozen=True)
class LinkSetting:
    bandwidth_mbps: float
    latency_ms: float

    @property
    def name(self) -> str:
        return f"{self.bandwidth_mbps:g} Mbit/s, {self.latency_ms:g} ms"

    def link(self):
        from edge_llm_ros.core.planning.costs import Link

        return Link(self.latency_ms / 1e3, self.bandwidth_mbps * 1e6)

    def launch_args(self) -> list[str]:
        return [f"link_emulation.hop.latency_ms:={self.latency_ms}",
                f"link_emulation.hop.bandwidth_mbps:={self.bandwidth_mbps}"]


@dataclass
class Goal:
    """One Generate goal as this process saw it (perf_counter times) and draft_node's figures."""

    mode: str
    tokens: list[int]
    sent: float
    first: float
    last: float
    done: float
    alt: float | None = None
    alr: float | None = None
    drafts: tuple[int, int, float] | None = None  # D0's (drafts, forwards, CPU seconds) for it

    @property
    def ttft_s(self) -> float:
        return self.first - self.sent


class Client:
    """This process as the application: Generate goals on /edge_llm/generate, feedback timed."""

    def __init__(self) -> None:
        from edge_llm_ros.runtime import action
        from edge_llm_ros.runtime.actions import ActionClient
        from edge_llm_ros.runtime.cli import Session

        self.session = Session()
        self.Generate = action("edge_llm_ros/action/Generate")
        self.client = ActionClient(self.session.node, self.Generate, "/edge_llm/generate", call_timeout=30.0)

    def wait_ready(self, deployment: Deployment, stages: int, since: float) -> None:
        """Until every stage and D0 said they are active and the action server answers."""
        deadline = time.monotonic() + START_TIMEOUT_S
        for pattern in [*(f"active: stage {i} of {stages}" for i in range(stages)), "active: D0 of a stage pipeline"]:
            while not deployment.log.find(pattern, since):
                deployment.check_alive()
                if time.monotonic() > deadline:
                    raise ToolError(f"no line /{pattern}/ within {START_TIMEOUT_S:g} s; last lines:\n"
                                    f"{deployment.log.tail()}")
                deployment.thread.join(0.2)
        while not self.client.wait_for_server(1.0):
            deployment.check_alive()
            if time.monotonic() > deadline:
                raise ToolError(f"/edge_llm/generate did not answer within {START_TIMEOUT_S:g} s")

    def stage_profile(self, index: int, rows: tuple[int, ...], cached: int,
                      together: threading.Barrier | None = None) -> list[float]:
        """Stage ``index``'s seconds for each count of ``rows`` over ``cached`` cached rows, as it measures
        itself (stage_node's `profile` service)."""
        return ask_profile(self.session.node, f"/edge_llm/stage_{index}/profile", rows, cached, together)

    def stage_profiles_together(self, stages: int, rows: tuple[int, ...], cached: int) -> list[list[float]]:
        """Every stage's `profile` asked at once: each measures itself while the others compute too."""
        together = threading.Barrier(stages)
        with ThreadPoolExecutor(stages) as pool:
            asked = [pool.submit(self.stage_profile, i, rows, cached, together) for i in range(stages)]
            return [a.result() for a in asked]

    def generate(self, log: EventLog, prompt: str, mode: str, max_new_tokens: int) -> Goal:
        """One greedy goal; its tokens, when it was sent, its first and last feedback, its result,
        and ALT / ALR from draft_node's line about it."""
        times, got = [], []
        arrived = threading.Condition()

        def on_feedback(msg) -> None:
            with arrived:
                if len(msg.feedback.token_ids):
                    times.append(time.perf_counter())
                    got.extend(msg.feedback.token_ids)
                    arrived.notify_all()

        since = time.monotonic()
        sent = time.perf_counter()
        goal = self.Generate.Goal(prompt=prompt, mode=mode, max_new_tokens=max_new_tokens, temperature=0.0)
        handle = self.client.send_goal_async(goal, on_feedback).result(30.0)
        if not handle.accepted:
            raise ToolError(f"draft_node rejected a {mode} goal")
        response = handle.get_result_async().result(GOAL_TIMEOUT_S)
        done = time.perf_counter()
        if response.status != STATUS_SUCCEEDED:
            raise ToolError(f"{mode} goal ended with status {response.status}: {response.result.finish_reason}")
        tokens = list(response.result.token_ids)
        with arrived:  # feedback is a topic, the result a service reply: the last feedback may come after it
            arrived.wait_for(lambda: len(got) >= len(tokens), 10.0)
        stats = self.stats_line(log, mode, len(tokens), since)
        drafts = (int(stats.group(5)), int(stats.group(6)), float(stats.group(7)))
        return Goal(mode, tokens, sent, times[0] if times else done, times[-1] if times else done, done,
                    float(stats.group(3)), float(stats.group(4)), drafts if stats.group(8) == "CPU" else None)

    @staticmethod
    def stats_line(log: EventLog, mode: str, tokens: int, since: float) -> re.Match:
        """draft_node's line about the request of ``mode`` with ``tokens`` tokens, sent after ``since``."""
        deadline = time.monotonic() + 10.0
        while True:
            found = [m for _, m in log.find(STATS_LINE, since) if m.group(1) == mode and int(m.group(2)) == tokens]
            if found:
                return found[0]
            if time.monotonic() > deadline:
                raise ToolError(f"draft_node said nothing about its {mode} request of {tokens} tokens (no ALT / ALR "
                                f"line); last lines:\n{log.tail()}")
            time.sleep(0.05)

    def close(self) -> None:
        self.client.destroy()
        self.session.close()


def node_cores() -> dict[str, int] | None:
    """stage_0 and D0 on the first core, stage_1 on the second; None with fewer than two cores or no taskset."""
    usable = sorted(os.sched_getaffinity(0))
    if len(usable) < 2 or shutil.which("taskset") is None:
        return None
    return {"stage_0": usable[0], "stage_1": usable[1], "draft_node": usable[0]}


def stages_plan(layers: str, link: LinkSetting | None, chunk: int, cores: dict[str, int] | None):
    """launch/stages.launch.py: the split, the link on every hop, the prefill chunk, the cores."""
    from edge_llm_ros.runtime.launcher import apply_launch_args, load_plan
    from edge_llm_ros.runtime.params import format_param_value

    plan = load_plan("stages")
    apply_launch_args(plan, [f"layers:={layers}", f"prefill_chunk:={chunk}", f"segment:={SEGMENT}",
                             f"in_flight:={len(layers.split(','))}", "threads:=1", "timeout_s:=60.0",
                             *(link.launch_args() if link else [])])
    for node in plan.nodes:
        if cores and node.name == "draft_node":
            node.prefix = ["taskset", "-c", str(cores[node.name])]
        elif cores and node.name in cores:
            node.parameters["cpus"] = format_param_value(str(cores[node.name]))
    return plan


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process (all its threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Others:
    """CPU other processes than this one and the deployment's used meanwhile, in cores."""

    def __init__(self, deployment: Deployment, names: list[str]) -> None:
        self.pids = [os.getpid(), *(deployment.pid(n) for n in names)]

    def __enter__(self) -> Others:
        self.cores = None
        self._start = (CpuShare._busy_s(), self._ours(), time.perf_counter())
        return self

    def __exit__(self, *exc) -> None:
        busy0, ours0, wall0 = self._start
        busy1, ours1, wall = CpuShare._busy_s(), self._ours(), time.perf_counter() - wall0
        if busy0 is not None and busy1 is not None and ours0 is not None and ours1 is not None and wall > 0:
            self.cores = max(0.0, (busy1 - busy0) - (ours1 - ours0)) / wall

    def _ours(self) -> float | None:
        try:
            return sum(cpu_seconds(pid) for pid in self.pids)
        except (OSError, ValueError, IndexError):
            return None


@dataclass
class Measured:
    """What one deployment measured."""

    link: LinkSetting | None
    chunk: int
    goals: dict[str, list[Goal]] = field(default_factory=dict)
    long: list[Goal] = field(default_factory=list)
    other_cores: float | None = None
    stage_s: list[list[float]] = field(default_factory=list)  # [stage][STAGE_PROFILE_ROWS]: the stages' own `profile`
    stage_s_together: list[list[float]] = field(default_factory=list)  # the same, every stage asked at once


def run_deployment(setup: Setup, client: Client, endpoint: str, log: EventLog, measured: Measured,
                   cores: dict[str, int] | None, modes: list[str], max_new_tokens: int, progress) -> None:
    """Launch the stages for ``measured``'s link and prefill chunk; run each prompt in every mode
    (interleaved) and the long prompt TTFT_REPEATS times (mode ar, one token), after warm-ups."""
    plan = stages_plan(setup.layers, measured.link, measured.chunk, cores)
    since = time.monotonic()
    with Deployment(plan, endpoint, log, "stage pipeline") as deployment:
        client.wait_ready(deployment, len(setup.ranges), since)
        for mode in modes:
            client.generate(log, setup.prompts[0].text, mode, WARMUP_TOKENS)
        if measured.link is None:  # each stage measures itself where it runs (Jupiter: each device profiles)
            measured.stage_s = [client.stage_profile(i, STAGE_PROFILE_ROWS, STAGE_PROFILE_CACHED)
                                for i in range(len(setup.ranges))]
            measured.stage_s_together = client.stage_profiles_together(len(setup.ranges), STAGE_PROFILE_ROWS,
                                                                       STAGE_PROFILE_CACHED)
        if setup.long_text:
            client.generate(log, setup.long_text, "ar", 1)
        with Others(deployment, [n.name for n in plan.nodes]) as others:
            for prompt in setup.prompts:
                for mode in modes:
                    measured.goals.setdefault(mode, []).append(client.generate(log, prompt.text, mode, max_new_tokens))
                    progress.update(1)
            for _ in range(TTFT_REPEATS if setup.long_text else 0):
                measured.long.append(client.generate(log, setup.long_text, "ar", 1))
                progress.update(1)
        measured.other_cores = others.cores
        deployment.check_alive()
        if deployment.crashes():
            raise ToolError(f"a node died during the measurement: {deployment.crashes()}")


@dataclass
class Setup:
    """What the bench knows before anything launches: the model, its measured costs and the plans."""

    target: object
    folder: Path  # the target's weights, for the in-process stages
    drafter: object
    profile: object  # core.planning.costs.LayerProfile
    ranges: list[range]
    prompts: list[BenchPrompt]
    prompt_ids: list[list[int]]
    references: list[list[int]]  # the engine's ar tokens per prompt
    long_text: str
    long_ids: list[int]
    long_reference: int  # the engine's first token after the long prompt
    draft_s: float = 0.0  # per draft forward on D0
    draft_call_s: float = 0.0  # per draft
    eos: tuple[int, ...] = ()
    # each stage's seconds as it measured itself in the deployment (stage_node's `profile`) over what the
    # profile gives for its layers, by rows: how much faster or slower the pinned stage process runs (None: 1)
    stage_factors: list | None = None  # a core.planning.costs.RowScale per stage
    # how many times longer a stage's message takes while the other stage computes too (two vCPUs of one
    # host share it): their profiles measured together over each alone (None: 1)
    contention: float | None = None
    stages: dict = field(default_factory=dict)  # ranges -> in-process stages (each simulation releases its request)

    @property
    def layers(self) -> str:
        return ",".join(f"{r.start}-{r.stop - 1}" for r in self.ranges)

    @property
    def row_bytes(self) -> int:
        return self.target.config.hidden_size * WIRE_BYTES
