"""``edge-llm-ros bench --scenario nav``: "go to the red chair" over seeded evaluation worlds, per
deployment of the VLM and per schedule (overlapped with motion, or stop-and-go).

    edge-llm-ros bench --scenario nav --json nav.json                 # seeds 100-109, every deployment
    edge-llm-ros bench --scenario nav --seeds 100-102 --deployments robot-ar,cloud-ar --rtt 50
    edge-llm-ros bench --scenario nav --policy expert --decide-s 0.3  # the teacher, decisions of 0.3 s

Each episode runs in simulated time (nav/simulated.py: the bridge's motion executor, the
kinematic Go2, and the navigator's episode policy, nav/episode.EpisodeController, the class
navigator_node runs on the robot: its schedule, carrying over by odometry and drops), and each
decision is real: SmolLM2 + the shipped navigation adapter on the frame the camera renders at the
pose the robot was at, constrained greedy, timed where it runs. On the robot, one Navigator; over
edge-cloud (nav/deployment.py: cloud-ar, edge-cloud-sd, -fsd, -ee) the robot's half and the
server's (an EarlyExitVerifier serving the nav task with the shipped exits) each on their own
threads, every message over an emulated link each way (runtime/link.py: --rtt / 2 and
--bandwidth; label "emulated link"), in this process on this machine's two cores. Every deployment
is lossless: two answers on one frame that differ are a LOSSLESS FAILURE and exit status 1. A
decision is computed once per pose and deployment.

Before the episodes, a calibration (four frames of the first world, each deployment timed) predicts
each deployment's decision time; the shortest is the one the plan picks (``planned``). Reported per
run: success rate (reached within 0.5 m, nothing touched), waiting per episode (the robot idle,
waiting for a decision), first motion (instruction to the first action), time to goal and path
length (mean over successful episodes), actions per episode; and the ratios stop-and-go / overlap
(waiting) and cloud AR / planned (first motion). Then EE's regime, simulated: every world's first
decision in each edge mode with EE's own Go2 deployment's seconds (Table 8). The PNG draws each
world with every run's path. ``--policy expert`` replaces the VLM by the camera expert with a fixed
decision time and the link by its model (no model runs).
"""

from __future__ import annotations

import argparse
import datetime
import math
import platform
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from edge_llm_ros.tools.bench_harness import Scenario, register
from edge_llm_ros.tools.generate import Parser
from edge_llm_ros.tools.loading import ToolError
from edge_llm_ros.tools.train_nav import seed_range

INSTRUCTION = "go to the red chair"
DEFAULT_SEEDS, QUICK_SEEDS = "100-109", "100"
SCHEDULES = ("overlap", "stop-and-go")
CALIBRATION_FRAMES = 4
LABEL = "simulated time, real decisions, emulated link"
EXPERT_LABEL = "simulated time, the expert's fixed decision time, modelled link"


@dataclass(frozen=True)
class Setup:
    seeds: range
    deployments: list[str]
    schedules: list[str]
    rtt_s: float
    bandwidth_bps: float
    max_actions: int
    policy: str  # vlm | expert
    decide_s: float  # the expert's decision time


class Computed(NamedTuple):
    command: object  # nav/actions.NavCommand
    valid: bool
    seconds: float  # the decision as the deployment takes it (measured; the expert's: modelled)
    rounds: int
    tokens: int  # the answer's tokens (0 for the expert: no model)


def pose_key(seed: int, pose) -> tuple:
    return seed, round(pose.x, 9), round(pose.y, 9), round(pose.yaw, 9)


class Decisions:
    """Decisions by (seed, pose, deployment), computed once (:class:`Computed`). Every deployment is
    lossless, so any two answers on one pose that differ are recorded in ``mismatches``."""

    def __init__(self, setup: Setup, camera, models) -> None:
        self.setup, self.camera, self.models = setup, camera, models
        self.cache: dict = {}
        self.mismatches: list[dict] = []

    def get(self, seed: int, world, pose, name: str) -> Computed:
        key = pose_key(seed, pose)
        known = self.cache.setdefault(key, {})
        if name not in known:
            new = known[name] = self.compute(world, pose, name)
            other = next((o for o in known if o != name), None)
            if other is not None and known[other].command.action != new.command.action:
                self.mismatches.append({"seed": seed, "pose": [pose.x, pose.y, pose.yaw], other: known[other].command.action,
                                        name: new.command.action})
        return known[name]

    def compute(self, world, pose, name: str) -> Computed:
        from edge_llm_ros.nav.deployment import DEPLOYMENTS

        setup = self.setup
        if setup.policy == "expert":
            from edge_llm_ros.nav.deployment import Link
            from edge_llm_ros.nav.expert import camera_expert

            frame_bytes = self.camera.width * self.camera.height * 3
            seconds = DEPLOYMENTS[name].modelled_s(setup.decide_s, 1, frame_bytes, Link(setup.rtt_s, setup.bandwidth_bps))
            return Computed(camera_expert(world, pose), True, seconds, 1, 0)
        decision = self.models.navigators[name].decide(self.camera.render(world, pose), INSTRUCTION)
        return Computed(decision.command, decision.valid, decision.decide_s, max(decision.stats.rounds, 1),
                        decision.stats.new_tokens)


class Models:
    """SmolLM2 + the shipped adapter, a navigator per deployment: on the robot a Navigator; over
    edge-cloud an EdgeCloudNavigator whose server (an EarlyExitVerifier serving the nav task with the
    shipped exits at EXIT_LAYERS, as verifier_node runs it) verifies on its own thread, every
    message crossing an emulated link each way (runtime/link.py: RTT/2 and the rate)."""

    def __init__(self, deployments: list[str], setup: Setup, threads: int | None) -> None:
        import numpy as np

        from edge_llm_ros.core.drafts.draft_models import load_draft
        from edge_llm_ros.core.drafts.exits import load_exits
        from edge_llm_ros.core.drafts.loading import set_threads
        from edge_llm_ros.core.edge_cloud import EarlyExitDrafter, EarlyExitVerifier
        from edge_llm_ros.core.engine.config import GenerationConfig
        from edge_llm_ros.core.engine.decoding import eos_ids
        from edge_llm_ros.core.engine.drafters import ModelDrafter
        from edge_llm_ros.core.engine.models import load_model
        from edge_llm_ros.nav.deployment import DEPLOYMENTS
        from edge_llm_ros.nav.navigator import (
            MAX_ANSWER_TOKENS,
            NAV_TASK,
            EdgeCloudNavigator,
            Navigator,
            answer_grammar,
            nav_exits,
            nav_task,
        )
        from edge_llm_ros.nav.vlm import NavAdapter
        from edge_llm_ros.runtime.link import Link, LinkSpec
        from edge_llm_ros.tools.edge_cloud_sim import EXIT_LAYERS

        set_threads(threads)
        target = load_model()
        adapter = NavAdapter.load(None, target)
        config = GenerationConfig(max_new_tokens=MAX_ANSWER_TOKENS, gamma=4)
        draft = load_draft(target, None).model
        spec = LinkSpec(latency_ms=setup.rtt_s * 1e3 / 2, bandwidth_mbps=setup.bandwidth_bps / 1e6)
        self.links = [Link(spec, "uplink"), Link(spec, "downlink")]
        grammar = answer_grammar(target.tokenizer, target.vocab_size)
        self.verifier = EarlyExitVerifier(target, load_exits(target), layers=list(EXIT_LAYERS), eos_ids=eos_ids(target),
                                          tasks={NAV_TASK: nav_task(adapter, target, grammar,
                                                                    nav_exits(adapter, target))})
        self.robot = EarlyExitDrafter([ModelDrafter(adapter.attach(draft, "draft"))], seed=0)

        def rounds(request_id, prompt, request_config, **start):
            from edge_llm_ros.core.edge_cloud import linked_rounds

            return linked_rounds(self.verifier, self.robot, prompt, request_config, uplink=self.links[0],
                                 downlink=self.links[1], request_id=request_id, timeout_s=60.0, **start)

        self.navigators = {}
        for name in deployments:
            d = DEPLOYMENTS[name]
            if d.target_on == "robot":
                self.navigators[name] = Navigator(adapter, target, draft if d.mode != "ar" else None,
                                                  config.with_overrides(mode=d.mode))
            else:
                self.navigators[name] = EdgeCloudNavigator(adapter, draft, rounds, d.mode, config)
        blank = np.zeros((adapter.config.height, adapter.config.width, 3), np.uint8)
        for navigator in self.navigators.values():  # torch's first passes are slow: not a decision to time
            navigator.decide(blank, INSTRUCTION)

    def close(self) -> None:
        self.robot.close()
        for link in self.links:
            link.close()


def calibrate(decisions: Decisions, setup: Setup) -> dict[str, float]:
    """Predicted seconds per decision of each deployment: the mean over CALIBRATION_FRAMES frames of
    the first world (the start, turned by a quarter turn each), each deployment timed on each."""
    from edge_llm_ros.nav.world import Pose
    from edge_llm_ros.nav.worldgen import GenerateConfig, generate

    seed = setup.seeds[0]
    world = generate(seed, GenerateConfig(clear_path=True))
    poses = [Pose(world.start.x, world.start.y, world.start.yaw + k * math.pi / 2) for k in range(CALIBRATION_FRAMES)]
    return {name: statistics.mean(decisions.get(seed, world, pose, name).seconds for pose in poses)
            for name in setup.deployments}


def ee_regime(models: Models, camera, worlds: dict) -> dict:
    """The first decision of every world (its start pose) in each edge mode, in simulated time with
    EE's own Go2 deployment's seconds (nav/deployment.ee_go2_costs; core/sim/edge_cloud.py runs
    the real draft, verifier, grammar, early outcomes and pre-drafts): the decision's seconds per
    mode, and cloud AR's over each speculative mode's. Simulated, not measured."""
    from dataclasses import asdict

    from edge_llm_ros.core.sim.edge_cloud import simulate_edge_cloud
    from edge_llm_ros.nav.deployment import DEPLOYMENTS, ee_go2_costs
    from edge_llm_ros.nav.navigator import EdgeCloudNavigator

    costs, inputs = ee_go2_costs(len(models.verifier.target.layer_ids))
    navigators = {name: n for name, n in models.navigators.items() if isinstance(n, EdgeCloudNavigator)}
    seconds: dict[str, list[float]] = {name: [] for name in navigators}
    rounds = {name: 0 for name in navigators}
    answers: dict[int, set] = {}
    for seed, world in worlds.items():
        frame = camera.render(world, world.start)
        for name, navigator in navigators.items():
            timeline = simulate_edge_cloud(models.verifier, models.robot, navigator.prompt(INSTRUCTION),
                                           navigator.config, costs, request_id=f"ee-go2-{seed}-{name}",
                                           **navigator.request(frame))
            seconds[name].append(timeline.total_s)
            rounds[name] += timeline.rounds
            answers.setdefault(seed, set()).add(tuple(timeline.tokens))
    first = {name: round(statistics.mean(v), 3) for name, v in seconds.items()}
    tokens = {seed: len(next(iter(a))) for seed, a in answers.items()}
    return {"label": "simulated: EE Table 8's seconds (Jetson Orin + Qwen2-VL-2B drafting, A100 + Qwen2-VL-7B "
                     "verifying), this run's tokens, acceptance and early outcomes",
            "inputs": [asdict(c) for c in inputs], "decisions": len(worlds),
            "first_motion_s": first,
            "tau": {name: round(sum(tokens.values()) / rounds[name], 2) for name in navigators
                    if DEPLOYMENTS[name].mode != "ar"},
            "cloud_ar_over": {name: round(first["cloud-ar"] / first[name], 3) for name in navigators
                              if "cloud-ar" in first and name != "cloud-ar"},
            "lossless": all(len(a) == 1 for a in answers.values()),
            "not_projected": "robot-ar and robot-sd (the regime's 7B target does not fit the robot)"}


def run_scenario(setup: Setup, threads: int | None = None, progress: bool = True) -> dict:
    from tqdm import tqdm

    from edge_llm_ros.nav.camera import Camera
    from edge_llm_ros.nav.deployment import DEPLOYMENTS, plan
    from edge_llm_ros.nav.simulated import EpisodeConfig, Timed, run_episode
    from edge_llm_ros.nav.worldgen import GenerateConfig, generate

    camera = Camera()
    models = Models(setup.deployments, setup, threads) if setup.policy == "vlm" else None
    try:
        decisions = Decisions(setup, camera, models)
        predicted = calibrate(decisions, setup)
        planned = plan(predicted)
        worlds = {seed: generate(seed, GenerateConfig(clear_path=True)) for seed in setup.seeds}
        runs = []
        total = len(setup.deployments) * len(setup.schedules) * len(setup.seeds)
        with tqdm(total=total, desc="nav", unit="episode", file=sys.stderr, disable=not progress) as bar:
            for name in setup.deployments:
                d = DEPLOYMENTS[name]
                for schedule in setup.schedules:
                    episodes, timings = {}, []
                    for seed, world in worlds.items():
                        def decide(pose, seed=seed, world=world, name=name, timings=timings):
                            computed = decisions.get(seed, world, pose, name)
                            timings.append(computed.seconds)
                            return Timed(computed.command, computed.seconds, computed.valid)

                        config = EpisodeConfig(overlap=schedule == "overlap", max_actions=setup.max_actions)
                        episodes[seed] = run_episode(world, decide, config)
                        bar.update(1)
                    runs.append(summarize(name, d, schedule, episodes, timings, name == planned, worlds))
        regime = ee_regime(models, camera, worlds) if models and any(
            DEPLOYMENTS[n].target_on == "server" for n in setup.deployments) else None
    finally:
        if models is not None:
            models.close()
    vlm = setup.policy == "vlm"
    report = {
        "scenario": "nav",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "label": LABEL if vlm else EXPERT_LABEL,
        "instruction": INSTRUCTION,
        "policy": "SmolLM2-135M + shipped navigation adapter (constrained greedy)" if vlm
                  else f"camera expert (the teacher), decisions of {setup.decide_s:g} s",
        "machine": {"cpu": platform.processor() or platform.machine(), "python": platform.python_version()},
        "link": {"rtt_ms": setup.rtt_s * 1000, "bandwidth_mbps": setup.bandwidth_bps / 1e6, "emulated": vlm,
                 "modelled": not vlm, "frame_bytes": camera.width * camera.height * 3},
        "seeds": list(setup.seeds),
        "max_actions": setup.max_actions,
        "predicted_decision_s": {k: round(v, 4) for k, v in predicted.items()},
        "planned": planned,
        "runs": runs,
        "ratios": ratios(runs, planned),
        "lossless": not decisions.mismatches,
        "mismatches": decisions.mismatches,
        "decisions_computed": sum(len(v) for v in decisions.cache.values()),
        "ee_regime": regime,
        "trajectories": {f"{r['deployment']}/{r['schedule']}": r.pop("trajectories") for r in runs},
        "worlds": {seed: world.to_dict() for seed, world in worlds.items()},
    }
    return report


def summarize(name: str, deployment, schedule: str, episodes: dict, timings: list[float], planned: bool,
              worlds: dict) -> dict:
    from edge_llm_ros.nav.world import body_gap

    values = list(episodes.values())
    ok = [e for e in values if e.success]

    def mean(xs):
        xs = list(xs)
        return round(statistics.mean(xs), 3) if xs else None

    return {
        "deployment": name, "mode": deployment.mode, "target_on": deployment.target_on,
        "overlap": schedule == "overlap", "schedule": schedule, "backend": "torch", "planned": planned,
        "seeds": list(episodes),
        "success_rate": round(len(ok) / len(values), 3),
        "waiting_s_per_episode": mean(e.waiting.total_s for e in values),
        "waited_rounds_share": round(sum(e.waiting.waited_rounds for e in values)
                                     / max(sum(e.waiting.rounds for e in values), 1), 3),
        "first_motion_s": mean(e.waiting.first_motion_s for e in values if e.waiting.first_motion_s is not None),
        "time_to_goal_s": mean(e.time_s for e in ok),
        "path_m": mean(e.path_m for e in ok),
        "actions_per_episode": mean(e.actions for e in values),
        "dropped_per_episode": mean(e.dropped for e in values),
        "decision_s": mean(timings),
        "episodes": {seed: {"outcome": e.outcome, "touched": e.touched, "time_s": round(e.time_s, 2),
                            "waiting_s": round(e.waiting.total_s, 2), "actions": e.actions,
                            "final_gap_m": round(body_gap(e.final, worlds[seed].target_object), 3)}
                     for seed, e in episodes.items()},
        "trajectories": {seed: [[round(x, 3), round(y, 3)] for _, x, y in e.trajectory[::4]] + [[e.final.x, e.final.y]]
                         for seed, e in episodes.items()},
    }


def ratios(runs: list[dict], planned: str) -> dict:
    """stop-and-go / overlap waiting per deployment; cloud AR / planned first motion per schedule."""
    by = {(r["deployment"], r["schedule"]): r for r in runs}
    out: dict = {"waiting_stop_and_go_over_overlap": {}, "first_motion_cloud_ar_over_planned": {}}
    for (name, schedule), r in by.items():
        other = by.get((name, "stop-and-go"))
        if schedule == "overlap" and other and r["waiting_s_per_episode"]:
            out["waiting_stop_and_go_over_overlap"][name] = round(other["waiting_s_per_episode"]
                                                                  / r["waiting_s_per_episode"], 2)
        cloud = by.get(("cloud-ar", schedule))
        if name == planned and cloud and r["first_motion_s"]:
            out["first_motion_cloud_ar_over_planned"][schedule] = round(cloud["first_motion_s"] / r["first_motion_s"], 3)
    return out


def format_table(report: dict) -> str:
    link = report["link"]
    lines = [f"bench --scenario nav: {report['policy']}; seeds {report['seeds'][0]}-{report['seeds'][-1]}; "
             f"link RTT {link['rtt_ms']:g} ms, {link['bandwidth_mbps']:g} Mbit/s ({report['label']})",
             "predicted decision (s): " + ", ".join(f"{k} {v:.3f}" for k, v in report["predicted_decision_s"].items())
             + f"; the plan picks {report['planned']}",
             f"{'deployment':<17}{'schedule':<13}{'success':>8}{'waiting/ep':>11}{'first mot.':>11}{'to goal':>9}"
             f"{'path m':>8}{'actions':>8}{'decide s':>9}"]
    for r in report["runs"]:
        def f(v, spec):
            return "-" if v is None else format(v, spec)
        lines.append(f"{r['deployment'] + (' *' if r['planned'] else ''):<17}{r['schedule']:<13}"
                     f"{r['success_rate']:>8.0%}{f(r['waiting_s_per_episode'], '.2f'):>11}"
                     f"{f(r['first_motion_s'], '.2f'):>11}{f(r['time_to_goal_s'], '.1f'):>9}{f(r['path_m'], '.2f'):>8}"
                     f"{f(r['actions_per_episode'], '.1f'):>8}{f(r['decision_s'], '.3f'):>9}")
    rat = report["ratios"]
    for name, value in rat["waiting_stop_and_go_over_overlap"].items():
        lines.append(f"waiting, stop-and-go / overlap, {name}: {value:.2f}x")
    for schedule, value in rat["first_motion_cloud_ar_over_planned"].items():
        lines.append(f"first motion, cloud-ar / planned ({report['planned']}), {schedule}: {value:.3f}x")
    ee = report.get("ee_regime")
    if ee:
        lines.append(f"EE's Go2 regime ({ee['label']}; first decisions of {ee['decisions']} worlds): "
                     + ", ".join(f"{name} {s:.2f} s" for name, s in ee["first_motion_s"].items())
                     + "".join(f"; cloud-ar / {name} {x:.3f}x" for name, x in ee["cloud_ar_over"].items()))
    lines.append(f"lossless (every deployment's answer the same on the same frame): {report['lossless']}"
                 + (f"; simulated: {ee['lossless']}" if ee else ""))
    return "\n".join(lines)


def plot(report: dict, path: Path) -> None:
    """Each world (walls, boxes, objects, the target ringed) with every run's path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    seeds = report["seeds"]
    cols = min(5, len(seeds))
    rows = math.ceil(len(seeds) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 3.2 * rows), squeeze=False)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, seed in zip(axes.flat, seeds):
        world = report["worlds"][seed]
        x0, y0, x1, y1 = world["bounds"]
        ax.plot([x0, x1, x1, x0, x0], [y0, y0, y1, y1, y0], color="black", linewidth=1)
        for wall in world.get("walls", []):
            ax.plot([wall[0], wall[2]], [wall[1], wall[3]], color="black", linewidth=1.5)
        for bx in world.get("boxes", []):
            ax.add_patch(plt.Rectangle((bx[0], bx[1]), bx[2] - bx[0], bx[3] - bx[1], color="grey"))
        for obj in world["objects"]:
            ax.add_patch(plt.Circle(obj["position"], obj["radius"], color=[c / 255 for c in obj["colour"]]))
            if obj["name"] == world["target"]:  # reached: the body within 0.5 m of it
                ax.add_patch(plt.Circle(obj["position"], obj["radius"] + 0.5, fill=False, linestyle=":"))
        for i, (key, paths) in enumerate(report["trajectories"].items()):
            xs, ys = zip(*paths[seed])
            ax.plot(xs, ys, color=colours[i % len(colours)], linewidth=1, label=key)
        ax.set_title(f"seed {seed}", fontsize=8)
        ax.set_aspect("equal")
        ax.tick_params(labelsize=6)
    for ax in list(axes.flat)[len(seeds):]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=6, loc="best")
    fig.suptitle(f"go to the red chair: {report['policy']} ({report['label']})", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# -- command line -------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    from edge_llm_ros.nav.deployment import DEPLOYMENTS

    p = Parser(prog="edge-llm-ros bench --scenario nav",
               description="Go2 navigation episodes per VLM deployment, overlapped vs stop-and-go (simulated time, "
                           "real decisions).")
    p.add_argument("--scenario", choices=["nav"], default="nav", help=argparse.SUPPRESS)
    p.add_argument("--seeds", default=None, help=f"evaluation worlds, FIRST-LAST (default {DEFAULT_SEEDS})")
    p.add_argument("--deployments", default=",".join(DEPLOYMENTS),
                   help=f"comma-separated subset of {','.join(DEPLOYMENTS)}")
    p.add_argument("--schedules", default=",".join(SCHEDULES), help=f"comma-separated subset of {','.join(SCHEDULES)}")
    p.add_argument("--rtt", type=float, default=50.0, help="link round-trip time, ms (emulated; the expert's: modelled)")
    p.add_argument("--bandwidth", type=float, default=100.0, help="link rate each way, Mbit/s")
    p.add_argument("--max-actions", type=int, default=40, help="an episode stops after this many actions")
    p.add_argument("--policy", choices=("vlm", "expert"), default="vlm",
                   help="vlm: SmolLM2 + the shipped adapter; expert: the camera expert (no model)")
    p.add_argument("--decide-s", type=float, default=1.0, help="the expert's decision time, s (--policy expert)")
    p.add_argument("--quick", action="store_true", help=f"seed {QUICK_SEEDS} only")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: every core)")
    p.add_argument("--json", default=None, metavar="FILE", help="write the report as JSON")
    p.add_argument("--png", default=None, metavar="FILE", help="trajectories (default: next to --json, .png)")
    p.add_argument("--log", default=None, help=argparse.SUPPRESS)
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    return p


def parse_setup(args) -> Setup:
    from edge_llm_ros.nav.deployment import DEPLOYMENTS

    def subset(text: str, known, flag: str) -> list[str]:
        items = list(dict.fromkeys(x.strip() for x in text.split(",") if x.strip()))
        if not items or any(x not in known for x in items):
            raise ToolError(f"{flag}: expected a subset of {','.join(known)}, got {text!r}")
        return items

    try:
        seeds = seed_range(args.seeds or (QUICK_SEEDS if args.quick else DEFAULT_SEEDS), "--seeds")
    except ValueError as exc:
        raise ToolError(str(exc)) from None
    if args.rtt < 0 or args.bandwidth <= 0:
        raise ToolError(f"--rtt must be >= 0 and --bandwidth > 0, got {args.rtt:g} ms, {args.bandwidth:g} Mbit/s")
    if args.max_actions < 1 or args.decide_s <= 0:
        raise ToolError("--max-actions must be >= 1 and --decide-s > 0")
    return Setup(seeds, subset(args.deployments, DEPLOYMENTS, "--deployments"),
                 subset(args.schedules, SCHEDULES, "--schedules"), args.rtt / 1000, args.bandwidth * 1e6,
                 args.max_actions, args.policy, args.decide_s)


def run(args: argparse.Namespace, progress: bool) -> dict:
    """The scenario on the parsed command line (the harness resolved --json and --png); the report."""
    return run_scenario(parse_setup(args), args.threads, progress=progress)


def failures(report: dict) -> list[str]:
    out = [f"LOSSLESS FAILURE: seed {mm['seed']} pose {mm['pose']}: "
           + ", ".join(f"{k} says {v!r}" for k, v in mm.items() if k not in ("seed", "pose"))
           for mm in report["mismatches"]]
    if (report.get("ee_regime") or {}).get("lossless") is False:
        out.append("LOSSLESS FAILURE: the simulated edge modes' answers differ on a start frame")
    return out


SCENARIO = register(Scenario(
    name="nav", help="Go2 navigation episodes per VLM deployment, overlapped vs stop-and-go (simulated time)",
    build_parser=build_parser, run=run, format_table=format_table, failures=failures, plot=plot,
))
