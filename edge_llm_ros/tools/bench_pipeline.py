"""``edge-llm-ros bench --scenario pipeline``: the stage pipeline measured on two pinned cores over
emulated links, simulated with the same schedulers, and projected to 4 and 8 Jetson-class stages.

    edge-llm-ros bench --scenario pipeline --json pipeline.json     # 2 links x 3 prompts x 64 tokens
    edge-llm-ros bench --scenario pipeline --quick                  # 1 link, 1 prompt, 32 tokens

Measured: ``launch/stages.launch.py`` for real, two stage_node processes (layers split by Jupiter's
plan_layers over this machine's measured per-layer costs), each pinned to a core of its own
(``cpus:=``) with one torch thread, and draft_node as D0 on the first stage's core (taskset). Every
hop crosses an emulated link (the runtime's, ``link_emulation.hop``: one-way latency and bandwidth,
labelled "emulated link"). Each prompt runs in every mode (ar: the naive pipeline, chunk_pp,
flowspec), greedy; per mode: decoding tokens/s (after the first token), end-to-end tokens/s, time to
first token, ALT and ALR (draft_node's figures), and lossless: the tokens equal the engine's ar
output. A 512-token prompt measures time to first token with the whole prompt in one message and
with Jupiter's pipelined prefill (chunks of the size plan_sequence gives, back to back).

Simulated: core.pipesim.simulate runs the same schedulers on in-process stages with the costs
measured here: per-layer and head seconds (LayerProfile, one thread), D0's seconds per draft and
per draft forward (timed here), the link, D0 sharing the first stage's core, and the runtime's cost
per message, measured on loopback (a deployment with the links off: its ar lap minus the profile's
compute, per hop). Each simulated mode is compared with the measured one: within 15% or flagged.

Projected: the same simulation on 4 and 8 stages with Jetson-class costs derived from the papers'
tables (core.pipesim.jetson_costs: every input cited in the report) and FlowSpec's own tree setting
for every method (core.pipeline.PAPER_SHAPE: 80-node trees in segments of 16, 64-node expansions);
the tokens and acceptance are still SmolLM2's (its target and shipped draft run in the simulator).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import math
import os
import platform
import re
import shutil
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TextIO

from . import stage_hop
from .bench import BUSY_CORES, LOSSLESS_MARK, CpuShare, fmt_value
from .deployment import Deployment, EventLog, ask_profile, bench_main, local_router, report_paths
from .generate import Parser
from .loading import ToolError
from .prompts import BENCH_PROMPTS, BenchPrompt

MODES = ("ar", "chunk_pp", "flowspec")
LINKS = ((100.0, 5.0), (1000.0, 1.0))  # (Mbit/s, one-way ms) per hop
PROMPTS, QUICK_PROMPTS = 3, 1
MAX_NEW_TOKENS, QUICK_MAX_NEW_TOKENS = 64, 32
PROJECTED_STAGES = (4, 8)
STAGE_PROFILE_ROWS, STAGE_PROFILE_CACHED = (1, 8, 24), 64  # what each stage measures of itself (a decode step's sizes)
PROJECTED_PROMPTS = 2
LONG_PROMPT_TOKENS = 512
TTFT_REPEATS = 3
SEGMENT = 8  # draft rows per FlowSpec segment (draft_node's default)
HOP_MESSAGES = 200  # messages per row count when timing a stage hop
WARMUP_TOKENS = 8
TOLERANCE = 0.15  # the simulator's tokens/s within this of the measured, every mode
WIRE_BYTES = 4  # hidden states cross as float32 (config/stages.yaml wire_dtype)
PROFILE_ROWS = (1, 4, 8, 16, 24, 32, 64, 128, 256, 512)
PROFILE_CACHED = (0, 256, 1024)
START_TIMEOUT_S = 300.0
GOAL_TIMEOUT_S = 300.0
STATUS_SUCCEEDED = 4
LABEL = "emulated link"
ANCHORS = {"SpecPipe": "4.19-5.53x over plain PP", "PipeInfer": "up to 2.15x"}
SHIPPED, ORACLE = "shipped", "oracle: the target drafting for itself (sensitivity)"
STATS_LINE = r"\[draft_node-\d+\].*: request \w+ \((\w+)\): (\d+) tokens, ALT ([\d.]+), ALR ([\d.]+)"


@dataclass(frozen=True)
class LinkSetting:
    bandwidth_mbps: float
    latency_ms: float

    @property
    def name(self) -> str:
        return f"{self.bandwidth_mbps:g} Mbit/s, {self.latency_ms:g} ms"

    def link(self):
        from edge_llm_ros.core.pipesim import Link

        return Link(self.latency_ms / 1e3, self.bandwidth_mbps * 1e6)

    def launch_args(self) -> list[str]:
        return [f"link_emulation.hop.latency_ms:={self.latency_ms}",
                f"link_emulation.hop.bandwidth_mbps:={self.bandwidth_mbps}"]


# -- this process: the model, its costs, the plans ------------------------------------------------------


@dataclass
class Setup:
    """What the bench knows before anything launches: the model, its measured costs and the plans."""

    target: object
    folder: Path  # the target's weights, for the in-process stages
    drafter: object
    profile: object  # core.pipesim.LayerProfile
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
    stage_factors: list[RowScale] | None = None
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


def long_prompt(tokenizer, tokens: int) -> str:
    """A prompt of about ``tokens`` tokens once the chat template is applied: a paragraph repeated."""
    from edge_llm_ros.core import chat_prompt

    unit, ask = " ".join(p.text for p in BENCH_PROMPTS), " Summarize the above in one line."
    text = unit
    while len(chat_prompt(tokenizer, text + ask)) < tokens:
        text += " " + unit
    words = text.split(" ")
    while len(chat_prompt(tokenizer, " ".join(words) + ask)) > tokens:
        words.pop()
    return " ".join(words) + ask


def plan_split(profile, num_layers: int, rows: int) -> list[range]:
    """Jupiter Eq. 1 over two identical cores, each layer costing what the profile measured for
    ``rows`` rows, the head on the last stage."""
    from edge_llm_ros.core.partition import ModelCost, StageDevice, plan_layers

    layer = float(profile.q()([rows], [0])[0])
    devices = [StageDevice(f"core {i}", [layer] * num_layers, 1 << 62, head_s=profile.head(rows) if i else 0.0)
               for i in range(2)]
    return list(plan_layers(devices, ModelCost([1] * num_layers)).ranges)


def stage_cost(profile, ranges: list[range]):
    """q(rows, prefix) of the slowest of ``ranges``'s stages (vectorised, for plan_sequence)."""
    import numpy as np

    q = profile.q()

    def seconds(rows, prefix):
        layer = q(rows, prefix)
        last = len(ranges[-1]) * layer + np.interp(rows, profile.rows, profile.head_s)
        return np.maximum(len(ranges[0]) * layer, last)

    return seconds


def prefill_chunk(setup: Setup, link: LinkSetting) -> tuple[int, object]:
    """Jupiter Eq. 2-4 for the long prompt on these stages and link (a stage's time includes its hop):
    (the chunk size the nodes take, ceil(prompt / k), and the plan)."""
    from edge_llm_ros.core.partition import plan_sequence

    q, hop = stage_cost(setup.profile, setup.ranges), link.link()

    def with_hop(rows, prefix):
        return q(rows, prefix) + hop.seconds(rows * setup.row_bytes)

    plan = plan_sequence(len(setup.long_ids), with_hop, len(setup.ranges))
    return math.ceil(len(setup.long_ids) / plan.k), plan


def prepare(prompts: list[BenchPrompt], max_new_tokens: int, progress) -> Setup:
    """Load SmolLM2 and its draft, measure the profile (one thread), plan the split, time the draft,
    compute the engine's reference tokens."""
    from edge_llm_ros.core import chat_prompt, generate_all, preset
    from edge_llm_ros.core.decoding import eos_ids
    from edge_llm_ros.core.draft_models import load_drafter
    from edge_llm_ros.core.loading import set_threads
    from edge_llm_ros.core.models import load_model, weights_folder
    from edge_llm_ros.core.pipesim import DraftCost, LayerProfile, TimedDrafter

    set_threads(1)
    progress.set_postfix_str("profile")
    target = load_model()
    drafter = load_drafter(target)
    profile = LayerProfile.measure(target, rows=PROFILE_ROWS, cached=PROFILE_CACHED, repeats=5)
    ranges = plan_split(profile, target.config.num_hidden_layers, SEGMENT)
    ids = [chat_prompt(target.tokenizer, p.text) for p in prompts]
    references = [generate_all(target, i, preset("ar", max_new_tokens=max_new_tokens)).tokens for i in ids]
    text = long_prompt(target.tokenizer, LONG_PROMPT_TOKENS)
    long_ids = chat_prompt(target.tokenizer, text)
    first = generate_all(target, long_ids, preset("ar", max_new_tokens=1)).tokens[0]
    setup = Setup(target, weights_folder(), drafter, profile, ranges, prompts, ids, references, text, long_ids, first,
                  eos=eos_ids(target))
    progress.set_postfix_str("timing the draft")
    timed = TimedDrafter(drafter)
    for mode in ("chunk_pp", "flowspec"):
        simulate_one(setup, mode, ids[0], min(max_new_tokens, 32), free_costs(), drafter=timed)
    cost = DraftCost.fit(timed.log)
    setup.draft_call_s, setup.draft_s = cost.per_draft_s, cost.per_forward_s
    progress.update(1)
    return setup


def remeasure(setup: Setup) -> float:
    """Measure the profile again (after the deployments) and keep the mean of both measurements; the
    drift between them (after / before - 1, the median over the grid): how steady this machine was."""
    from edge_llm_ros.core.pipesim import LayerProfile

    before = setup.profile
    after = LayerProfile.measure(setup.target, rows=PROFILE_ROWS, cached=PROFILE_CACHED, repeats=5)
    setup.profile = before.averaged(after)
    return statistics.median(b / a for la, lb in zip(before.layer_s, after.layer_s) for a, b in zip(la, lb)) - 1


# -- the simulation -----------------------------------------------------------------------------------


def free_costs():
    from edge_llm_ros.core.pipesim import CostModel

    return CostModel(stage_s=lambda stage, rows, cached: 0.0)


def stages_of(setup: Setup, ranges: list[range]) -> list:
    """In-process stages over ``ranges``, loaded once."""
    from edge_llm_ros.core.stages import Stage, load_stage_model

    key = tuple((r.start, r.stop) for r in ranges)
    if key not in setup.stages:
        last = len(ranges) - 1
        setup.stages[key] = [Stage(load_stage_model(setup.folder, r, first=i == 0, last=i == last), r,
                                   first=i == 0, last=i == last) for i, r in enumerate(ranges)]
    return setup.stages[key]


def simulate_one(setup: Setup, mode: str, prompt: list[int], max_new_tokens: int, costs, *, ranges=None,
                 drafter=None, chunk: int = 0, shape=None):
    """One request of ``mode`` through in-process stages (``ranges``: the measured split) under ``costs``;
    ``shape``: the trees (default: the deployments', draft_node's)."""
    from edge_llm_ros.core.pipesim import CountingDrafter, simulate
    from edge_llm_ros.nodes.stage_client import pipeline_scheduler

    ranges = ranges or setup.ranges
    scheduler = pipeline_scheduler(mode, f"sim-{mode}", prompt, CountingDrafter(drafter or setup.drafter),
                                   max_new_tokens=max_new_tokens, eos=setup.eos,
                                   segment=shape.segment if shape else SEGMENT, in_flight=len(ranges),
                                   prefill_chunk=chunk, shape=shape)
    return simulate(scheduler, stages_of(setup, ranges), costs)


def measured_costs(setup: Setup, link: LinkSetting | None, message_s: float, d0_shares: int | None):
    """The cost model of this machine: the profile, D0's draft costs, the link, the runtime's per-message cost."""
    from edge_llm_ros.core.pipesim import CostModel, Link

    base = setup.profile.stage_s(setup.ranges)
    factors = setup.stage_factors or [lambda rows: 1.0] * len(setup.ranges)
    return CostModel(stage_s=lambda stage, rows, cached: factors[stage](rows) * base(stage, rows, cached),
                     draft_s=setup.draft_s,
                     draft_call_s=setup.draft_call_s, row_bytes=setup.row_bytes,
                     link=link.link() if link else Link(), message_s=message_s, d0_shares=d0_shares,
                     contention=setup.contention or 1.0)


# -- the deployment -----------------------------------------------------------------------------------


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
        return Goal(mode, tokens, sent, times[0] if times else done, times[-1] if times else done, done,
                    float(stats.group(3)), float(stats.group(4)))

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


# -- the report ---------------------------------------------------------------------------------------


def same_tokens(ours: list[int], reference: list[int], eos: tuple[int, ...]) -> bool:
    """Equal, a trailing EOS on one side only not counted."""
    def strip(t):
        return t[:-1] if t and t[-1] in eos else t

    return list(ours) == list(reference) or strip(list(ours)) == strip(list(reference))


def pooled(tokens: list[int], spans: list[float]) -> float | None:
    """Tokens after the first over the seconds after the first token, over requests."""
    total = sum(spans)
    return sum(n - 1 for n in tokens) / total if total > 0 else None


def pooled_ratio(tokens: list[int], values: list[float | None]) -> float | None:
    """ALT or ALR over requests: all tokens after the first over all turns (or rounds)."""
    if any(v is None for v in values):
        return None
    per = [(n - 1) / v for n, v in zip(tokens, values) if v]
    return sum(n - 1 for n, v in zip(tokens, values) if v) / sum(per) if per else None


def measured_row(setup: Setup, mode: str, link: LinkSetting, goals: list[Goal]) -> dict:
    tokens = [len(g.tokens) for g in goals]
    lossless = all(same_tokens(g.tokens, ref, setup.eos) for g, ref in zip(goals, setup.references))
    return {"source": "measured", "stages": len(setup.ranges), "mode": mode, "link": f"{link.name} ({LABEL})",
            "device": "this machine", "draft": SHIPPED,
            "tokens_per_s": pooled(tokens, [g.last - g.first for g in goals]),
            "e2e_tokens_per_s": sum(tokens) / sum(g.done - g.sent for g in goals),
            "alt": pooled_ratio(tokens, [g.alt for g in goals]),
            "alr": pooled_ratio(tokens, [g.alr for g in goals]) if mode != "ar" else None,
            "ttft_s": statistics.mean(g.ttft_s for g in goals), "lossless": lossless, "tokens": sum(tokens),
            "requests": len(goals),
            "per_request": [{"prompt": p.name, "tokens": len(g.tokens), "ttft_s": g.ttft_s,
                             "tokens_per_s": pooled([len(g.tokens)], [g.last - g.first]), "alt": g.alt, "alr": g.alr}
                            for p, g in zip(setup.prompts, goals)]}


def simulated_row(setup: Setup, mode: str, link_name: str, timelines: list, *, stages: int, device: str,
                  references: list[list[int]] | None, draft: str = SHIPPED) -> dict:
    tokens = [len(t.tokens) for t in timelines]
    lossless = (all(same_tokens(t.tokens, ref, setup.eos) for t, ref in zip(timelines, references))
                if references is not None else None)
    busy = [sum(t.busy_s[i] for t in timelines) for i in range(stages)]
    return {"source": "simulated", "stages": stages, "mode": mode, "link": link_name, "device": device, "draft": draft,
            "tokens_per_s": pooled(tokens, [t.total_s - t.ttft_s for t in timelines]),
            "e2e_tokens_per_s": sum(tokens) / sum(t.total_s for t in timelines),
            "alt": pooled_ratio(tokens, [t.alt for t in timelines]),
            "alr": pooled_ratio(tokens, [t.alr for t in timelines]) if mode != "ar" else None,
            "ttft_s": statistics.mean(t.ttft_s for t in timelines), "lossless": lossless, "tokens": sum(tokens),
            "requests": len(timelines), "busy_s": busy, "d0_busy_s": sum(t.d0_busy_s for t in timelines),
            "stage_utilization": sum(busy) / (stages * sum(t.total_s for t in timelines))}


def error(simulated: float | None, measured: float | None) -> float | None:
    return (simulated - measured) / measured if simulated is not None and measured else None


def comparisons(rows: list[dict]) -> list[dict]:
    """Simulated against measured, per link and mode: tokens/s, TTFT, ALT."""
    out = []
    for m in (r for r in rows if r["source"] == "measured"):
        s = next(r for r in rows if r["source"] == "simulated" and r["stages"] == m["stages"]
                 and r["link"] == m["link"] and r["mode"] == m["mode"] and r["draft"] == SHIPPED)
        err = error(s["tokens_per_s"], m["tokens_per_s"])
        out.append({"link": m["link"], "mode": m["mode"], "measured_tokens_per_s": m["tokens_per_s"],
                    "simulated_tokens_per_s": s["tokens_per_s"], "error": err,
                    "within_tolerance": err is not None and abs(err) <= TOLERANCE,
                    "ttft_error": error(s["ttft_s"], m["ttft_s"]), "alt_error": error(s["alt"], m["alt"])})
    return out


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def speed(rows: list[dict], source: str, stages: int, link: str, mode: str, draft: str = SHIPPED) -> float | None:
    return next((r["tokens_per_s"] for r in rows if r["source"] == source and r["stages"] == stages
                 and r["link"] == link and r["mode"] == mode and r["draft"] == draft), None)


def targets(report: dict) -> list[dict]:
    """The issue's targets, each with the value reached and whether it was met."""
    rows, out = report["rows"], []

    def add(name: str, goal: str, value, met) -> None:
        out.append({"target": name, "goal": goal, "value": value, "met": met})

    for link in dict.fromkeys(r["link"] for r in rows if r["source"] == "measured"):
        flow_over_chunk = ratio(speed(rows, "measured", 2, link, "flowspec"),
                                speed(rows, "measured", 2, link, "chunk_pp"))
        add(f"measured 2 stages, {link}: FlowSpec / Chunk-PP tokens/s", ">= 1.5", flow_over_chunk,
            flow_over_chunk is not None and flow_over_chunk >= 1.5)
        alt = next((r["alt"] for r in rows if r["source"] == "measured" and r["link"] == link
                    and r["mode"] == "flowspec"), None)
        add(f"measured 2 stages, {link}: FlowSpec ALT", ">= 1.0", alt, alt is not None and alt >= 1.0)
    for p in report["prefill"]:
        if p["source"] == "measured":
            add(f"measured 2 stages, {p['link']}: TTFT of a {p['prompt_tokens']}-token prompt, pipelined / unchunked",
                "< 1", ratio(p["ttft_pipelined_s"], p["ttft_unchunked_s"]),
                p["ttft_pipelined_s"] < p["ttft_unchunked_s"])
    for h in report.get("stage_hop", []):
        if h["rows"] == stage_hop.TARGET_ROWS:
            add(f"a stage hop on loopback, {h['rows']} rows of hidden states: p50 ms", f"< {stage_hop.TARGET_MS:g}",
                h["p50_ms"], h["p50_ms"] < stage_hop.TARGET_MS)
    for c in report["comparisons"]:
        add(f"simulator vs measured, {c['link']}, {c['mode']}: tokens/s error", f"within {TOLERANCE:.0%}",
            c["error"], c["within_tolerance"])
    for stages in PROJECTED_STAGES:
        link = next((r["link"] for r in rows if r["stages"] == stages), None)
        if link is None:
            continue
        value = ratio(speed(rows, "simulated", stages, link, "flowspec"),
                      speed(rows, "simulated", stages, link, "chunk_pp"))
        add(f"simulated {stages} stages (Jetson-class): FlowSpec / Chunk-PP tokens/s", ">= 1.7 (paper: 1.37-1.73)",
            value, value is not None and value >= 1.7)
    return out


def anchors(rows: list[dict]) -> list[dict]:
    """FlowSpec over the naive pipeline (plain PP) where this bench has both, against SpecPipe and PipeInfer."""
    out = []
    for source, stages, link, draft in dict.fromkeys((r["source"], r["stages"], r["link"], r["draft"]) for r in rows):
        value = ratio(speed(rows, source, stages, link, "flowspec", draft), speed(rows, source, stages, link, "ar"))
        if value is not None:
            out.append({"source": source, "stages": stages, "link": link, "draft": draft,
                        "flowspec_over_plain_pp": value, **ANCHORS})
    return out


# -- the scenario -------------------------------------------------------------------------------------


def measure(setup: Setup, links: list[LinkSetting], chunks: dict, cores: dict[str, int] | None, modes: list[str],
            max_new_tokens: int, log_path: Path | None, bar) -> tuple[list[Measured], list[dict]]:
    """A stage hop on loopback (tools/stage_hop.py), then every deployment: loopback first (ar only: the
    runtime's cost per message), then each link with the whole prompt in one message (every mode, the
    long prompt) and with pipelined prefill (the long prompt)."""
    runs = [Measured(None, 0), *(Measured(link, c) for link in links for c in (0, chunks[link][0]))]
    with local_router("pipeline-router") as endpoint:
        bar.set_postfix_str("measuring: a stage hop on loopback")
        hop = [dataclasses.asdict(h) for h in stage_hop.measure(count=HOP_MESSAGES)]
        log, client = EventLog(log_path), Client()
        try:
            for measured in runs:
                bar.set_postfix_str(f"measuring: {measured.link.name if measured.link else 'loopback'}, "
                                    f"prefill chunk {measured.chunk or 'whole'}")
                if measured.link is None:
                    calibration = dataclasses.replace(setup, prompts=setup.prompts[:2], long_text="")
                    run_deployment(calibration, client, endpoint, log, measured, cores, ["ar"],
                                   min(max_new_tokens, 32), bar)
                else:
                    run_deployment(setup, client, endpoint, log, measured, cores, [] if measured.chunk else modes,
                                   max_new_tokens, bar)
                bar.update(1)
        finally:
            client.close()
            log.close()
    return runs, hop


def calibrate(setup: Setup, loopback: Measured, d0_shares: int | None) -> dict:
    """Each stage's speed in the deployment (its own `profile` over what the profile gives for its
    layers, by rows; set on ``setup``), how much the two cores slow each other, then the runtime's
    cost per message: the loopback ar lap measured, minus the simulated one without it, over the
    hops of a lap (D0 -> stages -> D0)."""
    from edge_llm_ros.core.pipesim import RowScale

    stage_s = setup.profile.stage_s(setup.ranges)
    setup.stage_factors = [RowScale.of(STAGE_PROFILE_ROWS, seconds,
                                       [stage_s(i, n, STAGE_PROFILE_CACHED) for n in STAGE_PROFILE_ROWS])
                           for i, seconds in enumerate(loopback.stage_s)] or None
    ratios = [t / a for alone, together in zip(loopback.stage_s, loopback.stage_s_together)
              for a, t in zip(alone, together)]
    setup.contention = float(statistics.median(ratios)) if ratios else None
    goals = loopback.goals["ar"]
    free = measured_costs(setup, None, 0.0, d0_shares)
    sims = [simulate_one(setup, "ar", ids, len(g.tokens), free) for ids, g in zip(setup.prompt_ids, goals)]
    measured = 1 / pooled([len(g.tokens) for g in goals], [g.last - g.first for g in goals])
    simulated = 1 / pooled([len(t.tokens) for t in sims], [t.total_s - t.ttft_s for t in sims])
    hops = len(setup.ranges) + 1
    return {"message_s": max(0.0, (measured - simulated) / hops),
            "message_s_from": f"loopback deployment (links off), ar: {measured * 1e3:.1f} ms a token measured, "
                              f"{simulated * 1e3:.1f} ms simulated without it, over {hops} hops",
            "stage_factors": [list(f.factors) for f in setup.stage_factors or []],
            "stage_factor_rows": list(STAGE_PROFILE_ROWS),
            "stage_factors_from": f"each stage's own profile service in the loopback deployment ({STAGE_PROFILE_ROWS} "
                                  f"rows over {STAGE_PROFILE_CACHED} cached) over the in-process profile's, by rows "
                                  "(interpolated between them)",
            "contention": setup.contention,
            "contention_from": "the same profiles asked of every stage at once over each asked alone (median): "
                               "a stage's slowdown while the other core computes, applied by the simulator "
                               "whenever both stages compute (processor sharing)"}


def link_rows(setup: Setup, link: LinkSetting, runs: list[Measured], costs, chunking: tuple, modes: list[str],
              max_new_tokens: int, bar) -> tuple[list[dict], list[dict]]:
    """Measured and simulated rows of one link, and its prefill rows (the long prompt, whole and chunked)."""
    whole = next(m for m in runs if m.link == link and not m.chunk)
    piped = next(m for m in runs if m.link == link and m.chunk)
    name, rows = f"{link.name} ({LABEL})", []
    for mode in modes:
        rows.append(measured_row(setup, mode, link, whole.goals[mode]))
        timelines = []
        for ids in setup.prompt_ids:
            timelines.append(simulate_one(setup, mode, ids, max_new_tokens, costs))
            bar.update(1)
        rows.append(simulated_row(setup, mode, name, timelines, stages=len(setup.ranges),
                                  device="this machine (simulated)", references=setup.references))
    size, plan = chunking
    sim = {c: simulate_one(setup, "ar", setup.long_ids, 1, costs, chunk=c) for c in (0, size)}
    bar.update(2)
    common = {"stages": len(setup.ranges), "link": name, "prompt_tokens": len(setup.long_ids), "chunk": size,
              "chunks": [min(size, len(setup.long_ids) - a) for a in range(0, len(setup.long_ids), size)],
              "jupiter_plan": {"chunks": list(plan.chunks), "latency_s": plan.latency_s}}
    prefill = [
        {"source": "measured", **common, "ttft_unchunked_s": statistics.median(g.ttft_s for g in whole.long),
         "ttft_pipelined_s": statistics.median(g.ttft_s for g in piped.long),
         "first_token_exact": all(g.tokens[:1] == [setup.long_reference] for g in whole.long + piped.long)},
        {"source": "simulated", **common, "ttft_unchunked_s": sim[0].ttft_s, "ttft_pipelined_s": sim[size].ttft_s,
         "first_token_exact": all(t.tokens[:1] == [setup.long_reference] for t in sim.values())},
    ]
    return rows, prefill


def projected_rows(setup: Setup, paper, modes: list[str], max_new_tokens: int, prompts: int, bar,
                   oracle: bool = False) -> list[dict]:
    """4 and 8 stages with the papers' Jetson-class costs and FlowSpec's own tree setting (PAPER_SHAPE,
    every method alike); SmolLM2's tokens and acceptance. ``oracle``: the drafting modes again with a
    draft that is always right (the target drafting for itself, at the same draft cost): what the
    schedules make of the pipeline once acceptance is no limit."""
    from edge_llm_ros.core.drafters import ModelDrafter
    from edge_llm_ros.core.pipeline import PAPER_SHAPE
    from edge_llm_ros.core.pipesim import even_ranges

    drafts = [(SHIPPED, setup.drafter, modes)]
    if oracle:
        drafts.append((ORACLE, ModelDrafter(setup.target), [m for m in modes if m != "ar"]))
    rows = []
    for stages in PROJECTED_STAGES:
        bar.set_postfix_str(f"projecting {stages} stages")
        ranges = even_ranges(setup.target.config.num_hidden_layers, stages)  # SmolLM2's, for the tokens
        for draft, drafter, drafting in drafts:
            for mode in drafting:
                timelines = []
                for ids in setup.prompt_ids[:prompts]:
                    timelines.append(simulate_one(setup, mode, ids, max_new_tokens, paper.cost_model(stages),
                                                  ranges=ranges, drafter=drafter, shape=PAPER_SHAPE))
                    bar.update(1)
                rows.append(simulated_row(setup, mode, f"{paper.link.describe()} (simulated link)", timelines,
                                          stages=stages, device=paper.device, references=setup.references,
                                          draft=draft))
    return rows


def run_scenario(prompts: list[BenchPrompt], links: list[LinkSetting], max_new_tokens: int, projected_prompts: int,
                 log_path: Path | None, progress: bool, oracle: bool = False, modes: tuple[str, ...] = MODES) -> dict:
    """Prepare, measure, calibrate, simulate, project; the report."""
    from tqdm import tqdm

    from edge_llm_ros.core.pipesim import jetson_costs

    started, cores, modes = time.perf_counter(), node_cores(), list(modes)
    d0_shares = 0 if cores else None
    steps = (3 + min(2, len(prompts)) + len(links) * (2 * len(modes) * len(prompts) + 2 * TTFT_REPEATS + 4)
             + len(PROJECTED_STAGES) * (2 * len(modes) - 1 if oracle else len(modes)) * projected_prompts)
    with tqdm(total=steps, desc="pipeline", unit="step", file=sys.stderr, disable=not progress,
              dynamic_ncols=True) as bar:
        setup = prepare(prompts, max_new_tokens, bar)
        chunks = {link: prefill_chunk(setup, link) for link in links}
        runs, hop = measure(setup, links, chunks, cores, modes, max_new_tokens, log_path, bar)
        bar.set_postfix_str("profile again")
        drift = remeasure(setup)
        bar.set_postfix_str("simulating")
        calibration = calibrate(setup, runs[0], d0_shares)
        bar.update(1)
        rows, prefill = [], []
        for link in links:
            costs = measured_costs(setup, link, calibration["message_s"], d0_shares)
            more, more_prefill = link_rows(setup, link, runs, costs, chunks[link], modes, max_new_tokens, bar)
            rows += more
            prefill += more_prefill
        paper = jetson_costs(latency_s=1e-3)
        rows += projected_rows(setup, paper, modes, max_new_tokens, projected_prompts, bar, oracle)
    report = report_of(setup, links, runs, rows, prefill, paper, cores, d0_shares, drift, calibration, max_new_tokens,
                       hop)
    report["wall_s"] = time.perf_counter() - started
    return report


def report_of(setup: Setup, links: list[LinkSetting], runs: list[Measured], rows: list[dict], prefill: list[dict],
              paper, cores, d0_shares, drift: float, calibration: dict, max_new_tokens: int,
              hop: list[dict] | None = None) -> dict:
    from edge_llm_ros.core.device_profile import cpu_name
    from edge_llm_ros.core.pipeline import PAPER_SHAPE

    profile = setup.profile
    report = {
        "scenario": "pipeline",
        "label": LABEL,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": {"cpu": cpu_name(), "cores": os.cpu_count(), "platform": platform.platform(),
                    "python": platform.python_version(), "torch_threads_per_process": 1,
                    "load_average_at_end": list(os.getloadavg()),
                    "other_processes_cores": {(m.link.name if m.link else "loopback") + f", chunk {m.chunk}":
                                              m.other_cores for m in runs}},
        "model": "SmolLM2-135M-Instruct (torch, float32)",
        "draft": "shipped trained draft (4 layers), draft_backend torch, one thread",
        "deployment": {"launch": "stages", "layers": setup.layers, "cores": cores, "segment": SEGMENT,
                       "in_flight": len(setup.ranges), "split": f"Jupiter Eq. 1 (plan_layers) over the profile at "
                                                              f"{SEGMENT} rows, head on the last stage"},
        "links": [{"name": link.name, "bandwidth_mbps": link.bandwidth_mbps, "latency_ms_one_way": link.latency_ms,
                   "label": LABEL, "where": "every hop: D0 -> stage 0 (rows, prunes), stage 0 -> stage 1, "
                                            "stage 1 -> D0 (runtime/link.py in the sender)"} for link in links],
        "max_new_tokens": max_new_tokens,
        "prompts": [{"name": p.name, "prompt_tokens": len(i)} for p, i in zip(setup.prompts, setup.prompt_ids)],
        "cost_model": {
            "profile": {"rows": profile.rows, "cached": profile.cached, "layer_s": profile.layer_s,
                        "head_s": profile.head_s, "threads": profile.threads, "source": profile.source},
            "profile_drift": drift, "draft_s_per_forward": setup.draft_s, "draft_s_per_draft": setup.draft_call_s,
            "d0_shares_core_of_stage": d0_shares, **calibration},
        "rows": rows,
        "prefill": prefill,
        "stage_hop": hop or [],
        "projection": {"device": paper.device, "model": paper.model, "layer_s": paper.layer_s,
                       "row_factor": paper.row_factor, "head_layers": paper.head_layers, "draft_s": paper.draft_s,
                       "row_bytes": paper.row_bytes,
                       "link": paper.link.describe(), "derivation": list(paper.derivation),
                       "inputs": [asdict(c) for c in paper.inputs],
                       "trees": {**asdict(PAPER_SHAPE), "in_flight": "the stage count",
                                 "source": "FlowSpec's reference code, config/run_config.py (mode eval), every "
                                           "method alike"}},
        "notes": [
            f"links: {LABEL} (the runtime's token bucket and one-way delay on every hop, in the sending process); "
            "all processes share this machine",
            "tokens_per_s: tokens after the first / (last token - first token), pooled over prompts; "
            "e2e_tokens_per_s: tokens / (goal sent -> result); ttft_s measured: goal sent -> first feedback; "
            "simulated: D0's start -> first token (no action, tokenizer or feedback hop)",
            "ALT: tokens per pipeline turn (an answer of the last stage while decoding), ALR: tokens per SD round, "
            "both without the first token (FlowSpec §V-A); measured from draft_node's line per request; ar has no "
            "rounds (ALR null). chunk_pp sends each round's tree in chunks of the segment's rows (FlowSpec §V-A: one "
            "setting for every method); every chunk's answer is a turn",
            "simulated rows: core.pipesim.simulate, the same schedulers and stages in this process; the 4 and 8 "
            "stage rows take their costs from the papers (projection.inputs, every number cited), FlowSpec's own "
            "tree setting for every method (projection.trees) and SmolLM2's tokens and acceptance (its target and "
            "draft ran in the simulator)",
            "lossless: every request's tokens equal the engine's ar output (a trailing EOS on one side only is "
            "not a difference)",
        ],
    }
    report["comparisons"] = comparisons(rows)
    report["targets"] = targets(report)
    report["anchors"] = anchors(rows)
    report["lossless"] = all(r["lossless"] is not False for r in rows) and all(p["first_token_exact"] for p in prefill)
    busy = [f"{k}: {v:.2f}" for k, v in report["machine"]["other_processes_cores"].items() if v and v > BUSY_CORES]
    if busy:
        report["warning"] = ("other processes kept cores busy while measuring (cores): " + ", ".join(busy)
                             + "; the measured rows and the simulator's errors are unreliable: rerun on an idle "
                               "machine")
        report["notes"].append(report["warning"])
    return report


# -- output -------------------------------------------------------------------------------------------


def format_table(report: dict) -> str:
    from edge_llm_ros.core.pipesim import RowScale

    d, cm = report["deployment"], report["cost_model"]
    cores = d["cores"]
    placed = (f"cores {cores['stage_0']} and {cores['stage_1']}, D0 on core {cores['draft_node']}" if cores
              else "not pinned")
    lines = [f"pipeline: {report['model']} as {len(d['layers'].split(','))} stages ({d['layers']}), {placed}, one "
             f"thread each; {report['max_new_tokens']} new tokens x {len(report['prompts'])} prompt(s), greedy; "
             f"links: {LABEL}",
             f"cost model: draft {cm['draft_s_per_forward'] * 1e3:.1f} ms/forward + "
             f"{cm['draft_s_per_draft'] * 1e3:.1f} ms/draft, runtime {cm['message_s'] * 1e3:.2f} ms/message "
             f"({cm['message_s_from']}); per-layer costs drifted {cm['profile_drift']:+.1%} between the profiles "
             "before and after the deployments; the stages ran at "
             + " and ".join(RowScale(tuple(cm["stage_factor_rows"]), tuple(f)).describe()
                            for f in cm.get("stage_factors") or [])
             + f" the profile's seconds (their own profile service), {cm.get('contention') or 1.0:.2f}x that while "
             "both compute",
             f"{'source':<10}{'stages':>6}  {'link':<42}{'mode':<18}{'tok/s':>7}{'err':>6}{'e2e':>7}{'ALT':>6}"
             f"{'ALR':>6}{'TTFT ms':>8}{'util':>6}  lossless"]
    errors = {(c["link"], c["mode"]): c["error"] for c in report["comparisons"]}
    for r in report["rows"]:
        shipped = r["draft"] == SHIPPED
        err = errors.get((r["link"], r["mode"])) if r["source"] == "simulated" and r["stages"] == 2 else None
        flag = "" if err is None or abs(err) <= TOLERANCE else " !"
        mode = r["mode"] + ("" if shipped else " (oracle)")
        lines.append(f"{r['source']:<10}{r['stages']:>6}  {r['link']:<42}{mode:<18}"
                     f"{fmt_value(r['tokens_per_s'], '.2f'):>7}{fmt_value(err, '+.0%') if err is not None else '':>6}"
                     f"{fmt_value(r['e2e_tokens_per_s'], '.2f'):>7}{fmt_value(r['alt'], '.2f'):>6}"
                     f"{fmt_value(r['alr'], '.2f'):>6}{fmt_value(r['ttft_s'], '.0f', 1000):>8}"
                     f"{fmt_value(r.get('stage_utilization'), '.0%'):>6}  {LOSSLESS_MARK[r['lossless']]}{flag}")
    lines.append("err: simulated vs measured tokens/s; util: the stages' mean busy share (simulated)"
                 + ("; (oracle): a draft that is always right, a sensitivity" if any(r["draft"] != SHIPPED
                                                                                    for r in report["rows"]) else ""))
    if report.get("warning"):
        lines.append(f"WARNING: {report['warning']}")
    lines.append("")
    lines.append("time to first token, 512-token prompt (ar): unchunked vs pipelined prefill (Jupiter)")
    for p in report["prefill"]:
        lines.append(f"  {p['source']:<10}{p['link']:<42}whole {p['ttft_unchunked_s'] * 1e3:7.0f} ms   chunks of "
                     f"{p['chunk']:>3} ({len(p['chunks'])}) {p['ttft_pipelined_s'] * 1e3:7.0f} ms   "
                     f"{fmt_value(ratio(p['ttft_pipelined_s'], p['ttft_unchunked_s']), '.2f')}x  first token "
                     f"{LOSSLESS_MARK[p['first_token_exact']]}")
    if report.get("stage_hop"):
        lines += ["", *stage_hop.report([stage_hop.HopStats(**h) for h in report["stage_hop"]])]
    lines.append("")
    lines.append(f"FlowSpec over the naive pipeline (plain PP); anchors: SpecPipe {ANCHORS['SpecPipe']}, PipeInfer "
                 f"{ANCHORS['PipeInfer']}")
    for a in report["anchors"]:
        lines.append(f"  {a['source']:<10}{a['stages']} stages, {a['link']}"
                     f"{'' if a['draft'] == SHIPPED else ', oracle draft'}: {a['flowspec_over_plain_pp']:.2f}x")
    lines.append("targets:")
    for t in report["targets"]:
        value = fmt_value(t["value"], "+.1%") if "error" in t["target"] else fmt_value(t["value"], ".2f")
        lines.append(f"  {'met   ' if t['met'] else 'MISSED'} {t['target']}: {value} (goal {t['goal']})")
    trees = report["projection"]["trees"]
    lines.append(f"projected costs ({report['projection']['device']}, {report['projection']['model']}): "
                 f"{report['projection']['layer_s'] * 1e3:.2f} ms/layer, draft "
                 f"{report['projection']['draft_s'] * 1e3:.1f} ms/forward, {report['projection']['link']}; trees: "
                 f"{trees['init_size']} nodes (top-{trees['branch']}, depth {trees['init_depth']}) in segments of "
                 f"{trees['segment']}, expansions of {trees['expand_size']} (FlowSpec's evaluation setting); inputs "
                 "and derivation in the JSON")
    return "\n".join(lines)


def plot(report: dict, path: Path) -> None:
    """Tokens/s per mode: measured vs simulated per link (2 stages), then the projections."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = report["rows"]
    groups = list(dict.fromkeys((r["stages"], r["link"]) for r in rows))
    fig, axes = plt.subplots(1, len(groups), figsize=(3.2 * len(groups), 4.2), squeeze=False)
    for ax, (stages, link) in zip(axes[0], groups):
        sources = [s for s in ("measured", "simulated") if any(r["source"] == s and r["stages"] == stages
                                                               and r["link"] == link for r in rows)]
        for k, source in enumerate(sources):
            values = [speed(rows, source, stages, link, m) or 0.0 for m in MODES]
            label = source if len(sources) > 1 else "projected (simulated, Jetson-class costs)"
            ax.bar([i + 0.4 * k - 0.2 * (len(sources) - 1) for i in range(len(MODES))], values, 0.4, label=label)
        ax.set_xticks(range(len(MODES)), MODES)
        ax.set_title(f"{stages} stages\n{link}", fontsize=8)
        ax.set_ylabel("tokens/s (decoding)")
        ax.legend(fontsize=7)
    fig.suptitle(f"stage pipeline, SmolLM2-135M; {LABEL}s; 4/8 stages: Jetson-class costs from the papers",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# -- command line -------------------------------------------------------------------------------------


def link_settings(text: str) -> list[LinkSetting]:
    """'100:5,1000:1' -> (Mbit/s, one-way ms) settings."""
    try:
        out = [LinkSetting(float(a), float(b)) for a, _, b in (item.partition(":") for item in text.split(",")
                                                                if item.strip())]
    except ValueError:
        raise ToolError(f"--links takes MBIT_S:MS pairs, comma-separated (e.g. 100:5,1000:1), got {text!r}") from None
    if not out or any(link.bandwidth_mbps <= 0 or link.latency_ms < 0 for link in out):
        raise ToolError(f"--links needs a bandwidth > 0 and a latency >= 0, got {text!r}")
    return out


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="edge-llm-ros bench --scenario pipeline",
               description="The stage pipeline measured over emulated links, simulated, and projected to 4 and 8 "
                           "Jetson-class stages.")
    p.add_argument("--scenario", choices=["pipeline"], default="pipeline", help=argparse.SUPPRESS)
    p.add_argument("--json", default=None, metavar="FILE", help="write the report as JSON")
    p.add_argument("--png", default=None, metavar="FILE",
                   help="plot tokens/s per mode (default: next to --json, .png; needs matplotlib)")
    p.add_argument("--log", default=None, metavar="FILE", help="the nodes' output (default: next to --json, .log)")
    p.add_argument("--links", default=",".join(f"{b:g}:{m:g}" for b, m in LINKS),
                   help="emulated links as MBIT_S:MS (one-way), comma-separated (default 100:5,1000:1; --quick: the "
                        "first)")
    p.add_argument("--prompts", type=int, default=None,
                   help=f"bench prompts (default {PROMPTS}; --quick {QUICK_PROMPTS})")
    p.add_argument("--max-new-tokens", type=int, default=None,
                   help=f"new tokens per prompt (default {MAX_NEW_TOKENS}; --quick {QUICK_MAX_NEW_TOKENS})")
    p.add_argument("--oracle", action="store_true",
                   help="also project chunk_pp and flowspec with a draft that is always right (the target drafting "
                        "for itself, at the same draft cost): a sensitivity, not a target row (adds 1-2 minutes)")
    p.add_argument("--quick", action="store_true", help="one link, one prompt, fewer tokens")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    return p


def run(argv: list[str] | None) -> tuple[dict, Path | None, Path | None]:
    """Parse ``argv`` and run the bench: (report, --json path, --png path); ToolError for bad input."""
    args = build_parser().parse_args(argv)
    links = link_settings(args.links)[: 1 if args.quick else None]
    count = args.prompts or (QUICK_PROMPTS if args.quick else PROMPTS)
    max_new = args.max_new_tokens or (QUICK_MAX_NEW_TOKENS if args.quick else MAX_NEW_TOKENS)
    if not 1 <= count <= len(BENCH_PROMPTS) or max_new < 1:
        raise ToolError(f"--prompts must be in 1..{len(BENCH_PROMPTS)} and --max-new-tokens >= 1")
    json_path, png, log = report_paths(args)
    report = run_scenario(list(BENCH_PROMPTS[:count]), links, max_new, min(count, PROJECTED_PROMPTS), log,
                          progress=not args.no_progress, oracle=args.oracle)
    return report, json_path, png


def failures(report: dict) -> list[str]:
    return [f"LOSSLESS FAILURE: {r['source']} {r['mode']} ({r['stages']} stages, {r['link']}) differs from the "
            "engine's ar" for r in report["rows"] if r["lossless"] is False]


def main(argv: list[str] | None = None, out: TextIO | None = None, err: TextIO | None = None) -> int:
    return bench_main(argv, out, err, run, format_table, plot, failures)


if __name__ == "__main__":
    sys.exit(main())
