"""``edge-llm-ros bench --scenario nav``: "go to the red chair" over seeded evaluation worlds, per
deployment of the VLM and per schedule (overlapped with motion, or stop-and-go).

    edge-llm-ros bench --scenario nav --json nav.json                 # seeds 100-109, every deployment
    edge-llm-ros bench --scenario nav --seeds 100-102 --deployments robot-ar,cloud-ar --rtt 50
    edge-llm-ros bench --scenario nav --policy expert --decide-s 0.3  # the teacher, decisions of 0.3 s

Each episode runs in simulated time (core/nav/episode.py: the bridge's motion executor, the
kinematic Go2, the navigator's overlap schedule and its carrying over by odometry), and each
decision is real: SmolLM2 + the shipped navigation adapter on the frame the camera renders at the
pose the robot was at, constrained greedy, timed. The deployments (core/nav/deployment.py) share
the answers (every mode is lossless, checked here: a speculative answer that differs from ar's on
the same frame is a LOSSLESS FAILURE and exit status 1) and differ in time: robot compute as
measured; the link to the server modelled from --rtt and --bandwidth (round trips and bytes, the
server as fast as this machine: label "modelled link"). A decision is computed once per pose and
mode and reused by the deployments that ask for the same one.

Before the episodes, a calibration (four frames of the first world, each mode timed) predicts each
deployment's decision time; the shortest is the one the plan picks (``planned``). Reported per
run: success rate (reached within 0.5 m, nothing touched), waiting per episode (the robot idle,
waiting for a decision), first motion (instruction to the first action), time to goal and path
length (mean over successful episodes), actions per episode; and the ratios stop-and-go / overlap
(waiting) and cloud AR / planned (first motion). The PNG draws each world with every run's path.
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
from typing import NamedTuple, TextIO

from .deployment import bench_main, report_paths
from .generate import Parser
from .loading import ToolError
from .train_nav import seed_range

INSTRUCTION = "go to the red chair"
DEFAULT_SEEDS, QUICK_SEEDS = "100-109", "100"
SCHEDULES = ("overlap", "stop-and-go")
CALIBRATION_FRAMES = 4
LABEL = "simulated time, real decisions, modelled link"


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
    command: object  # core/nav/actions.NavCommand
    valid: bool
    compute_s: float
    rounds: int
    tokens: int  # the answer's tokens (0 for the expert: no model)


def pose_key(seed: int, pose) -> tuple:
    return seed, round(pose.x, 9), round(pose.y, 9), round(pose.yaw, 9)


class Decisions:
    """Decisions by (seed, pose, mode), computed once (:class:`Computed`)."""

    def __init__(self, setup: Setup, camera, navigators: dict) -> None:
        self.setup, self.camera, self.navigators = setup, camera, navigators
        self.cache: dict = {}
        self.mismatches: list[dict] = []

    def get(self, seed: int, world, pose, mode: str):
        key = pose_key(seed, pose)
        known = self.cache.setdefault(key, {})
        if mode not in known:
            new = known[mode] = self.compute(world, pose, mode)
            for other_mode, other in known.items():  # every speculative answer against ar's, once
                if "ar" in (mode, other_mode) and other_mode != mode and other.command.action != new.command.action:
                    ar, spec, spec_mode = (new, other, other_mode) if mode == "ar" else (other, new, mode)
                    self.mismatches.append({"seed": seed, "pose": [pose.x, pose.y, pose.yaw],
                                            "ar": ar.command.action, "mode": spec_mode,
                                            "answer": spec.command.action})
        return known[mode]

    def compute(self, world, pose, mode: str):
        if self.setup.policy == "expert":
            from edge_llm_ros.core.nav.expert import camera_expert

            return Computed(camera_expert(world, pose), True, self.setup.decide_s, 1, 0)
        decision = self.navigators[mode].decide(self.camera.render(world, pose), INSTRUCTION)
        return Computed(decision.command, decision.valid, decision.decide_s, max(decision.stats.rounds, 1),
                        decision.stats.new_tokens)


def load_navigators(modes: set[str], threads: int | None) -> dict:
    """A warmed-up navigator per decoding mode, sharing the target, the draft and the adapter."""
    import numpy as np

    from edge_llm_ros.core import GenerationConfig, load_model
    from edge_llm_ros.core.draft_models import load_draft
    from edge_llm_ros.core.loading import set_threads
    from edge_llm_ros.core.nav.navigator import MAX_ANSWER_TOKENS, Navigator
    from edge_llm_ros.core.nav.vlm import NavAdapter

    set_threads(threads)
    target = load_model()
    adapter = NavAdapter.load(None, target)
    draft = load_draft(target, None).model if modes - {"ar"} else None
    navigators = {mode: Navigator(adapter, target, draft, GenerationConfig(mode=mode, max_new_tokens=MAX_ANSWER_TOKENS,
                                                                           gamma=4))
                  for mode in sorted(modes)}
    for navigator in navigators.values():  # torch's first passes are slow: not a decision to time
        navigator.decide(np.zeros((96, 128, 3), np.uint8), INSTRUCTION)
    return navigators


def calibrate(decisions: Decisions, setup: Setup, link, frame_bytes: int) -> dict[str, float]:
    """Predicted seconds per decision of each deployment, from CALIBRATION_FRAMES frames of the first
    world (the start, turned by a quarter turn each), every mode timed on each."""
    from edge_llm_ros.core.nav.deployment import DEPLOYMENTS
    from edge_llm_ros.core.nav.world import Pose
    from edge_llm_ros.core.nav.worldgen import GenerateConfig, generate

    seed = setup.seeds[0]
    world = generate(seed, GenerateConfig(clear_path=True))
    poses = [Pose(world.start.x, world.start.y, world.start.yaw + k * math.pi / 2) for k in range(CALIBRATION_FRAMES)]
    predicted = {}
    for name in setup.deployments:
        d = DEPLOYMENTS[name]
        times = []
        for pose in poses:
            computed = decisions.get(seed, world, pose, d.mode)
            times.append(d.decision_s(computed.compute_s, computed.rounds, frame_bytes, link))
        predicted[name] = statistics.mean(times)
    return predicted


def ee_regime(decisions: Decisions, starts: set[tuple]) -> dict | None:
    """Every pose decided both in ar and in sd (the same frame, the same answer), its tokens and rounds
    projected onto EE's own Go2 deployment (core/nav/deployment.EE_GO2): cloud AR against edge-cloud
    sd per decision, and for the first motion (the decisions at the worlds' start poses, ``starts``).
    Simulated, not measured; None without such pairs (one mode only, or the expert: no tokens)."""
    from edge_llm_ros.core.nav.deployment import DEPLOYMENTS, EE_GO2

    pairs = {key: (known["ar"], known["sd"]) for key, known in decisions.cache.items()
             if "ar" in known and "sd" in known and known["sd"].tokens}
    if not pairs:
        return None
    cloud, edge = DEPLOYMENTS["cloud-ar"], DEPLOYMENTS["edge-cloud-sd"]

    def seconds(keys) -> dict[str, float] | None:
        keys = [k for k in keys if k in pairs]
        if not keys:
            return None
        return {"cloud-ar": round(statistics.mean(EE_GO2.decision_s(cloud, pairs[k][0].tokens, pairs[k][0].rounds)
                                                  for k in keys), 3),
                "edge-cloud-sd": round(statistics.mean(EE_GO2.decision_s(edge, pairs[k][1].tokens, pairs[k][1].rounds)
                                                       for k in keys), 3)}

    decision, first = seconds(pairs), seconds(starts)
    sd = [sd for _, sd in pairs.values()]
    return {"label": "simulated: EE Table 8's seconds, this run's tokens and rounds", "regime": EE_GO2.name,
            "sources": list(EE_GO2.sources), "gamma": EE_GO2.gamma, "decisions": len(pairs),
            "tau": round(sum(d.tokens for d in sd) / sum(d.rounds for d in sd), 2),
            "decision_s": decision, "first_motion_s": first,
            "first_motion_cloud_ar_over_edge_cloud_sd": round(first["cloud-ar"] / first["edge-cloud-sd"], 3)
            if first else None,
            "not_projected": "robot-ar and robot-sd (the regime's 7B target does not fit the robot); fsd and ee "
                             "(pre-drafting from early exits needs a grammar-aware verifier, not built yet)"}


def run_scenario(setup: Setup, threads: int | None = None, progress: bool = True) -> dict:
    from tqdm import tqdm

    from edge_llm_ros.core.nav.camera import Camera
    from edge_llm_ros.core.nav.deployment import DEPLOYMENTS, Link, plan
    from edge_llm_ros.core.nav.episode import EpisodeConfig, Timed, run_episode
    from edge_llm_ros.core.nav.worldgen import GenerateConfig, generate

    link = Link(setup.rtt_s, setup.bandwidth_bps)
    camera = Camera()
    frame_bytes = camera.width * camera.height * 3
    modes = {DEPLOYMENTS[name].mode for name in setup.deployments}
    navigators = load_navigators(modes, threads) if setup.policy == "vlm" else {}
    decisions = Decisions(setup, camera, navigators)
    predicted = calibrate(decisions, setup, link, frame_bytes)
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
                    def decide(pose, seed=seed, world=world):
                        computed = decisions.get(seed, world, pose, d.mode)
                        seconds = d.decision_s(computed.compute_s, computed.rounds, frame_bytes, link)
                        timings.append(seconds)
                        return Timed(computed.command, seconds, computed.valid)

                    config = EpisodeConfig(overlap=schedule == "overlap", max_actions=setup.max_actions)
                    episodes[seed] = run_episode(world, decide, config)
                    bar.update(1)
                runs.append(summarize(name, d, schedule, episodes, timings, name == planned, worlds))
    report = {
        "scenario": "nav",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "label": LABEL,
        "instruction": INSTRUCTION,
        "policy": "SmolLM2-135M + shipped navigation adapter (constrained greedy)" if setup.policy == "vlm"
                  else f"camera expert (the teacher), decisions of {setup.decide_s:g} s",
        "machine": {"cpu": platform.processor() or platform.machine(), "python": platform.python_version()},
        "link": {"rtt_ms": setup.rtt_s * 1000, "bandwidth_mbps": setup.bandwidth_bps / 1e6, "modelled": True,
                 "frame_bytes": frame_bytes},
        "seeds": list(setup.seeds),
        "max_actions": setup.max_actions,
        "predicted_decision_s": {k: round(v, 4) for k, v in predicted.items()},
        "planned": planned,
        "runs": runs,
        "ratios": ratios(runs, planned),
        "lossless": not decisions.mismatches,
        "mismatches": decisions.mismatches,
        "decisions_computed": sum(len(v) for v in decisions.cache.values()),
        "ee_regime": ee_regime(decisions, {pose_key(seed, w.start) for seed, w in worlds.items()}),
        "trajectories": {f"{r['deployment']}/{r['schedule']}": r.pop("trajectories") for r in runs},
        "worlds": {seed: world.to_dict() for seed, world in worlds.items()},
    }
    return report


def summarize(name: str, deployment, schedule: str, episodes: dict, timings: list[float], planned: bool,
              worlds: dict) -> dict:
    from edge_llm_ros.core.nav.world import body_gap

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
             f"{'deployment':<15}{'schedule':<13}{'success':>8}{'waiting/ep':>11}{'first mot.':>11}{'to goal':>9}"
             f"{'path m':>8}{'actions':>8}{'decide s':>9}"]
    for r in report["runs"]:
        def f(v, spec):
            return "-" if v is None else format(v, spec)
        lines.append(f"{r['deployment'] + (' *' if r['planned'] else ''):<15}{r['schedule']:<13}"
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
        lines.append(f"EE's Go2 regime ({ee['label']}; {ee['decisions']} decisions, tau {ee['tau']:.2f}): decision "
                     f"cloud-ar {ee['decision_s']['cloud-ar']:.2f} s, edge-cloud-sd {ee['decision_s']['edge-cloud-sd']:.2f} s"
                     + (f"; first motion cloud-ar / edge-cloud-sd {ee['first_motion_cloud_ar_over_edge_cloud_sd']:.3f}x"
                        if ee["first_motion_s"] else ""))
    lines.append(f"lossless (speculative answers equal ar's on the same frames): {report['lossless']}")
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
    from edge_llm_ros.core.nav.deployment import DEPLOYMENTS

    p = Parser(prog="edge-llm-ros bench --scenario nav",
               description="Go2 navigation episodes per VLM deployment, overlapped vs stop-and-go (simulated time, "
                           "real decisions).")
    p.add_argument("--scenario", choices=["nav"], default="nav", help=argparse.SUPPRESS)
    p.add_argument("--seeds", default=None, help=f"evaluation worlds, FIRST-LAST (default {DEFAULT_SEEDS})")
    p.add_argument("--deployments", default="robot-ar,robot-sd,cloud-ar,edge-cloud-sd",
                   help=f"comma-separated subset of {','.join(DEPLOYMENTS)}")
    p.add_argument("--schedules", default=",".join(SCHEDULES), help=f"comma-separated subset of {','.join(SCHEDULES)}")
    p.add_argument("--rtt", type=float, default=50.0, help="link round-trip time, ms (modelled)")
    p.add_argument("--bandwidth", type=float, default=100.0, help="link rate, Mbit/s (modelled)")
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
    from edge_llm_ros.core.nav.deployment import DEPLOYMENTS

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


def run(argv: list[str] | None) -> tuple[dict, Path | None, Path | None]:
    """Parse ``argv`` and run the bench: (report, --json path, --png path); ToolError for bad input."""
    args = build_parser().parse_args(argv)
    setup = parse_setup(args)
    json_path, png, _ = report_paths(args)
    report = run_scenario(setup, args.threads, progress=not args.no_progress)
    return report, json_path, png


def failures(report: dict) -> list[str]:
    return [f"LOSSLESS FAILURE: seed {mm['seed']} pose {mm['pose']}: ar says {mm['ar']!r}, {mm['mode']} {mm['answer']!r}"
            for mm in report["mismatches"]]


def main(argv: list[str] | None = None, out: TextIO | None = None, err: TextIO | None = None) -> int:
    return bench_main(argv, out, err, run, format_table, plot, failures)


if __name__ == "__main__":
    sys.exit(main())
