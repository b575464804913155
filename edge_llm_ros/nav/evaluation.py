"""The navigator's success, measured: "go to the red chair" over seeded worlds, played as
navigator_node plays it, in simulated time.

Contract: :func:`evaluate` runs one episode per seed through nav/simulated.run_episode (the
episode policy navigator_node runs, nav/episode.EpisodeController; the bridge's motion executor;
the kinematic Go2) with :data:`NODE_EPISODE`, config/go2_sim.yaml's navigator and bridge
(overlapped, carried over by odometry, 60 actions, frames up to 2 s old). Each decision is the
navigator's (nav/navigator.Navigator: constrained greedy) on the frame the camera renders at the
pose it was taken. Each decision takes ``decide_s`` seconds of simulated time: a fixed time makes
the outcome a function of the answers alone, whatever the machine's load; None takes each as
measured, as ``bench --scenario nav`` does. Returns a :class:`WorldOutcome` per seed: what ended
the episode and why (the body gap left, the last answer and its confidence, what the frame it was
decided on showed). Knows nothing about ROS.

The worlds: worldgen's clear-path worlds, the kind the adapter trains on (seeds from 10000,
vlm_training.TRAIN_SEED_BASE). :data:`EVAL_SEEDS` are the evaluation worlds every report uses;
:data:`CHECK_SEEDS` a second range neither trained nor selected on, so a success that holds only
on the ten evaluation worlds shows.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from edge_llm_ros.nav.camera import Camera
from edge_llm_ros.nav.expert import ExpertConfig, where_seen
from edge_llm_ros.nav.simulated import EpisodeConfig, Timed, TimedEpisode, run_episode
from edge_llm_ros.nav.world import Pose, World, body_gap
from edge_llm_ros.nav.worldgen import GenerateConfig, generate

EVAL_SEEDS = range(100, 110)  # the evaluation worlds (bench --seeds 100-109): never trained on
CHECK_SEEDS = range(200, 210)  # a second held-out range: never trained on, never chosen by
TARGET = "red chair"
NODE_EPISODE = EpisodeConfig(overlap=True, max_actions=60)  # config/go2_sim.yaml's navigator and bridge
PLANNED_DECIDE_S = 0.55  # robot-sd's decision, the plan's pick (bench --scenario nav, docs/navigation.md)


@dataclass(frozen=True)
class WorldOutcome:
    """One world's episode: ``outcome`` as nav/simulated reports it (reached | stopped short |
    touched | invalid answer | max_actions | decisions too slow | timeout), the body gap to the
    target at the end, actions handed over, and the last answer: its text, its action line's
    probability, its least probable token's (a stop is decided in the reason's "reached": the
    action line follows it with certainty) and what its frame showed of each object in view
    (``seen``: 'red chair ahead, 2.1 m; dark red chair left, 0.8 m')."""

    seed: int
    outcome: str
    gap_m: float
    actions: int
    touched: str
    last_answer: str
    last_confidence: float
    last_least_p: float
    seen: str

    @property
    def success(self) -> bool:
        return self.outcome == "reached"

    def line(self) -> str:
        """'107: stopped short, 0.52 m from the red chair after 14 actions; last 'stop' (p 1.000, least
        sure token 0.613) on a frame showing red chair ahead, 0.6 m'."""
        action = self.last_answer.rpartition("action: ")[2].strip() or self.last_answer.strip()
        touched = f" ({self.touched})" if self.touched else ""
        return (f"{self.seed}: {self.outcome}{touched}, {self.gap_m:.2f} m from the {TARGET} after {self.actions} "
                f"actions; last {action!r} (p {self.last_confidence:.3f}, least sure token {self.last_least_p:.3f}) "
                f"on a frame showing {self.seen or 'nothing'}")


def world(seed: int, decoys: tuple[str, ...] = ()) -> World:
    """The seed's world, as bench --scenario nav and the node's `seeded` world draw it; with
    ``decoys``, those kinds stand where the search sees one of them first (GenerateConfig.decoys)."""
    return generate(seed, GenerateConfig(target=TARGET, clear_path=True, decoys=decoys))


def seen_from(world_: World, pose: Pose, config: ExpertConfig = ExpertConfig()) -> str:
    """Every object the camera shows from ``pose``, nearest first: 'red chair ahead, 2.1 m; ...'."""
    shown = [(body_gap(pose, o), o) for o in world_.objects if where_seen(world_, pose, o, config) != "not in view"]
    return "; ".join(f"{o.name} {where_seen(world_, pose, o, config)}, {gap:.1f} m" for gap, o in sorted(
        shown, key=lambda x: x[0]))


def navigator_decide(navigator, world_: World, camera: Camera, instruction: str,
                     decide_s: float | None) -> Callable[[Pose], Timed]:
    """run_episode's ``decide``: the navigator's answer on the frame rendered at the pose, taking
    ``decide_s`` (None: as measured)."""

    def decide(pose: Pose) -> Timed:
        d = navigator.decide(camera.render(world_, pose), instruction)
        least = min(d.stats.token_probs, default=math.nan)
        return Timed(d.command, d.decide_s if decide_s is None else decide_s, d.valid, d.text, d.confidence, least)

    return decide


def outcome_of(seed: int, world_: World, episode: TimedEpisode) -> WorldOutcome:
    last = episode.hand_overs[-1] if episode.hand_overs else None
    return WorldOutcome(seed, episode.outcome, body_gap(episode.final, world_.target_object), episode.actions,
                        episode.touched, last.decision.text if last else "",
                        last.decision.confidence if last else math.nan, last.decision.least_p if last else math.nan,
                        seen_from(world_, last.frame.image) if last else "")


def evaluate(navigator, seeds: Iterable[int], *, decide_s: float | None = PLANNED_DECIDE_S,
             config: EpisodeConfig = NODE_EPISODE, camera: Camera | None = None,
             progress: Callable[[WorldOutcome], None] | None = None,
             decoys: tuple[str, ...] = ()) -> list[WorldOutcome]:
    """One episode per seed (see the module docstring; ``decoys``: world's); ``progress`` gets each
    as it ends."""
    camera = camera or Camera()
    instruction = f"go to the {TARGET}"
    outcomes = []
    for seed in seeds:
        w = world(seed, decoys)
        outcome = outcome_of(seed, w, run_episode(w, navigator_decide(navigator, w, camera, instruction, decide_s),
                                                  config))
        outcomes.append(outcome)
        if progress is not None:
            progress(outcome)
    return outcomes


def report(outcomes: Sequence[WorldOutcome]) -> str:
    """'reached 9/10 (100-109), nothing touched' and one line per world."""
    seeds = [o.seed for o in outcomes]
    touched = [o.seed for o in outcomes if o.outcome == "touched"]
    head = (f"reached {sum(o.success for o in outcomes)}/{len(outcomes)} ({min(seeds)}-{max(seeds)}), "
            + (f"touched in {touched}" if touched else "nothing touched"))
    return "\n".join([head, *(o.line() for o in outcomes)])
