"""What the navigation adapter's training and evaluation add for issue 28, without a real model:
DAgger's learner samples (the states the learner's own decisions reach, labelled by the teacher),
the closed loop as the node runs it (nav/evaluation.py) and its per-world diagnosis, and the
options of `edge-llm-ros train nav` that choose worlds and teacher."""

import math

import pytest

from edge_llm_ros.core.engine.config import GenerationStats
from edge_llm_ros.nav import vlm_training as vt
from edge_llm_ros.nav.actions import NavCommand
from edge_llm_ros.nav.camera import Camera
from edge_llm_ros.nav.expert import camera_expert, rollout
from edge_llm_ros.nav.navigator import Decision
from edge_llm_ros.nav.world import Pose, body_gap

SEED = vt.TRAIN_SEED_BASE + 3


class Scripted:
    """A navigator that answers ``command`` whatever the frame, and counts the frames it saw."""

    def __init__(self, command: NavCommand) -> None:
        self.command, self.frames = command, 0

    def decide(self, frame, instruction):
        assert frame.shape == (96, 128, 3) and instruction.startswith("go to the ")
        self.frames += 1
        return Decision(self.command, self.command.text(), "", 0.75, 0.1, GenerationStats(token_probs=[0.9, 0.6, 1.0]))


def test_a_learner_that_always_stops_is_overruled_into_the_teachers_own_episode():
    """Every stop the teacher would not make is replaced by the teacher's action: the states are
    the teacher's rollout, each labelled with the teacher's answer, and the learner saw each."""
    camera = Camera()
    learner = Scripted(NavCommand("stop", "", "red chair ahead, under 1 m, reached"))
    samples = vt.learner_samples(learner, [SEED], camera)
    target = vt.target_for(SEED)
    world = vt.world_for(SEED, target)
    taught = rollout(world, lambda w, p: camera_expert(w, p, config=vt.TEACHER), max_steps=40)
    assert taught.success and learner.frames == len(taught.steps) == len(samples)
    for sample, (pose, command) in zip(samples, taught.steps):
        assert (sample.frame == camera.render(world, pose)).all()
        assert sample.answer == command.text() and sample.instruction == f"go to the {target}"
        assert (sample.labels == vt.frame_labels(world, pose, vt.TEACHER)).all()


def test_a_learner_that_only_turns_is_labelled_where_it_went_not_where_the_teacher_would_go():
    """The learner's own states: turning in place from the start, 30 degrees a step, until
    max_steps; each frame labelled with what the teacher does there (forward once it faces the
    target, which the learner never does)."""
    camera = Camera()
    samples = vt.learner_samples(Scripted(NavCommand("turn_left", "medium", "searching left")), [SEED], camera,
                                 max_steps=12)
    world = vt.world_for(SEED, vt.target_for(SEED))
    start = world.start
    poses = [Pose(start.x, start.y, start.yaw + k * math.radians(30)) for k in range(12)]
    assert len(samples) == 12
    for sample, pose in zip(samples, poses):
        assert sample.answer == camera_expert(world, pose, config=vt.TEACHER).text()
    assert {s.answer.rpartition("action: ")[2] for s in samples} != {"turn_left medium"}  # it saw the target


def test_the_closed_loop_runs_the_nodes_policy_and_says_why_an_episode_ended():
    """evaluate: one episode per seed through the episode policy in simulated time; a navigator
    that stops at once stops short, one action handed over, at the start's gap, the frame showing
    no target (it starts out of view), the stop's confidences kept (its action line's, its least
    sure token's)."""
    from edge_llm_ros.nav.evaluation import evaluate, report, world

    outcomes = evaluate(Scripted(NavCommand("stop", "", "red chair not in view, searching left")), [100, 101])
    assert [o.seed for o in outcomes] == [100, 101]
    for o in outcomes:
        w = world(o.seed)
        assert o.outcome == "stopped short" and o.actions == 1 and not o.touched and not o.success
        assert o.gap_m == pytest.approx(body_gap(w.start, w.target_object))
        assert o.last_confidence == 0.75 and o.last_least_p == 0.6 and "red chair" not in o.seen
        assert f"{o.seed}: stopped short, {o.gap_m:.2f} m" in o.line()
    assert report(outcomes).startswith("reached 0/2 (100-101), nothing touched")


@pytest.mark.parametrize("argv, error", [
    (["--check-worlds", "10005-10009"], "--check-worlds 10005-10009 overlaps"),  # training worlds
    (["--eval-worlds", "9995-9999"], "--eval-worlds 9995-9999 overlaps"),  # the held-out frames' worlds
    (["--worlds", "100", "--check-worlds", "10099-10100"], "overlaps the training and held-out worlds (9992-10099)"),
    (["--dagger-worlds", "5"], "--dagger-worlds needs --init"),
    (["--worlds", "100", "--decoy-worlds", "10", "--check-worlds", "10105-10110"],
     "overlaps the training and held-out worlds (9992-10109)"),
    (["--decoy-worlds", "-1"], "--decoy-worlds"),
    (["--stop-margin", "0.2"], "--stop-margin"), (["--stop-margin", "-0.1"], "--stop-margin"),
])
def test_train_nav_refuses_worlds_it_would_train_on_and_a_teacher_outside_the_reach(argv, error, capsys):
    from edge_llm_ros.tools.train import main

    assert main(["nav", *argv]) == 2
    assert error in capsys.readouterr().err


def test_a_warmup_keeps_a_fine_tunes_first_step_small(tiny_lms):
    """NavTrainConfig.warmup_steps: a fresh AdamW's first step moves every weight by about lr
    (it undid the shipped adapter in one step at 2e-3); over a warmup of 10 steps the first moves
    them a tenth as far."""
    import torch

    from edge_llm_ros.nav.vlm import AdapterConfig, NavAdapter, lora_shapes

    target, draft = tiny_lms
    samples = vt.collect_samples([vt.TRAIN_SEED_BASE], Camera(), perturb=0)[:4]
    config = AdapterConfig(hidden={"target": 32, "draft": 32}, lora={"target": lora_shapes(target)})
    moved = {}
    for warmup in (0, 10):
        torch.manual_seed(0)
        adapter = NavAdapter(config)
        before = {k: v.clone() for k, v in adapter.state_dict().items()}
        vt.train_adapter(adapter, target, None, target.tokenizer, samples,
                         vt.NavTrainConfig(epochs=1, batch_size=4, lr=1e-2, warmup_steps=warmup, max_steps=1))
        moved[warmup] = max(float((v - before[k]).abs().max()) for k, v in adapter.state_dict().items()
                            if k.startswith("projectors.target"))
    assert moved[0] == pytest.approx(1e-2, rel=0.2) and moved[10] == pytest.approx(1e-3, rel=0.2), moved
