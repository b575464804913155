"""The launched stage pipeline of ``bench --scenario pipeline``, measured from this process: the
launch plan (launch/stages.launch.py, each stage pinned to a core, D0 on the first stage's core),
the Generate client (edge_llm_ros.client) that times every goal's feedback and reads ALT / ALR
and D0's drafts from the result's InferenceStats, readiness from every node's lifecycle state, the
stages' own `profile` answers, the CPU other processes took meanwhile, and one deployment's run
(:func:`run_deployment`). The scenario (tools/bench_pipeline.py) decides what runs where.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from edge_llm_ros.tools.bench_harness import busy_cpu_seconds
from edge_llm_ros.tools.deployment import Deployment, EventLog, ask_profile, node_backend
from edge_llm_ros.tools.loading import ToolError
from edge_llm_ros.tools.prompts import BenchPrompt

WIRE_BYTES = 4  # hidden states cross as float32 (config/stages.yaml wire_dtype)


STAGE_PROFILE_ROWS, STAGE_PROFILE_CACHED = (1, 8, 24), 64  # what each stage measures of itself (a decode step's sizes)
TTFT_REPEATS = 3
SEGMENT = 8  # draft rows per FlowSpec segment (draft_node's default)
WARMUP_TOKENS = 8
START_TIMEOUT_S = 300.0
GOAL_TIMEOUT_S = 300.0


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
    """One Generate goal as this process saw it (time.monotonic() times) and D0's figures from its
    result's stats (InferenceStats: alt, alr, drafts, draft_forwards, draft_time_s, draft_time_is_cpu)."""

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


def goal_of(mode: str, sent: float, chunks: list, done: float, result) -> Goal:
    """A finished goal: its tokens, when its first and last tokens came, and D0's figures (the drafts
    only when D0 timed them as its thread's CPU time)."""
    times = [c.at for c in chunks if c.token_ids]
    s = result.stats
    drafts = (s.drafts, s.draft_forwards, s.draft_time_s) if s.draft_time_is_cpu else None
    return Goal(mode, list(result.token_ids), sent, times[0] if times else done, times[-1] if times else done, done,
                s.alt, s.alr, drafts)


class Client:
    """This process as the application: an LLMClient on /edge_llm/generate, feedback timed, and the
    stages' `profile` services."""

    def __init__(self) -> None:
        from edge_llm_ros.client import LLMClient

        self.llm = LLMClient("/edge_llm", timeout=GOAL_TIMEOUT_S, backend=node_backend())

    def wait_ready(self, deployment: Deployment, stages: int) -> None:
        """Until every stage and D0 (draft_node, serving /edge_llm/generate) are lifecycle-active."""
        deadline = time.monotonic() + START_TIMEOUT_S
        for i in range(stages):
            self.llm.wait_until_active(f"/edge_llm/stage_{i}", max(deadline - time.monotonic(), 0.0),
                                       check=deployment.check_alive)
        self.llm.wait_until_ready(max(deadline - time.monotonic(), 0.0), check=deployment.check_alive)

    def stage_profile(self, index: int, rows: tuple[int, ...], cached: int,
                      together: threading.Barrier | None = None) -> list[float]:
        """Stage ``index``'s seconds for each count of ``rows`` over ``cached`` cached rows, as it measures
        itself (stage_node's `profile` service)."""
        return ask_profile(self.llm.node, f"/edge_llm/stage_{index}/profile", rows, cached, together)

    def stage_profiles_together(self, stages: int, rows: tuple[int, ...], cached: int) -> list[list[float]]:
        """Every stage's `profile` asked at once: each measures itself while the others compute too."""
        together = threading.Barrier(stages)
        with ThreadPoolExecutor(stages) as pool:
            asked = [pool.submit(self.stage_profile, i, rows, cached, together) for i in range(stages)]
            return [a.result() for a in asked]

    def generate(self, prompt: str, mode: str, max_new_tokens: int) -> Goal:
        """One greedy goal, streamed: its tokens, when it was sent, its first and last tokens, its
        result, and D0's figures from the result's stats."""
        from edge_llm_ros.errors import RequestError

        sent = time.monotonic()
        try:
            stream = self.llm.stream(prompt, mode=mode, max_new_tokens=max_new_tokens, temperature=0.0)
            chunks = list(stream)
            result = stream.result()
        except (RequestError, TimeoutError) as exc:
            raise ToolError(f"a {mode} goal failed: {exc}") from None
        return goal_of(mode, sent, chunks, stream.ended_at or time.monotonic(), result)

    def close(self) -> None:
        self.llm.close()


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
        self._start = (busy_cpu_seconds(), self._ours(), time.perf_counter())
        return self

    def __exit__(self, *exc) -> None:
        busy0, ours0, wall0 = self._start
        busy1, ours1, wall = busy_cpu_seconds(), self._ours(), time.perf_counter() - wall0
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
    with Deployment(plan, endpoint, log, "stage pipeline") as deployment:
        client.wait_ready(deployment, len(setup.ranges))
        for mode in modes:
            client.generate(setup.prompts[0].text, mode, WARMUP_TOKENS)
        if measured.link is None:  # each stage measures itself where it runs (Jupiter: each device profiles)
            measured.stage_s = [client.stage_profile(i, STAGE_PROFILE_ROWS, STAGE_PROFILE_CACHED)
                                for i in range(len(setup.ranges))]
            measured.stage_s_together = client.stage_profiles_together(len(setup.ranges), STAGE_PROFILE_ROWS,
                                                                       STAGE_PROFILE_CACHED)
        if setup.long_text:
            client.generate(setup.long_text, "ar", 1)
        with Others(deployment, [n.name for n in plan.nodes]) as others:
            for prompt in setup.prompts:
                for mode in modes:
                    measured.goals.setdefault(mode, []).append(client.generate(prompt.text, mode, max_new_tokens))
                    progress.update(1)
            for _ in range(TTFT_REPEATS if setup.long_text else 0):
                measured.long.append(client.generate(setup.long_text, "ar", 1))
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
