"""Replay fixtures for the Go2 navigator (issue 15): short rosbag2 bags of what the simulator's camera
shows plus an instruction, and the navigator's own answers to their frames.

    python -m edge_llm_ros.tools.nav_bags                 # -> test/data/nav_bags/
    python -m edge_llm_ros.tools.nav_bags --out /tmp/bags

Each scenario stands the robot at one pose of an evaluation world (seed 100, never trained on) for
DURATION_S: its frames, rendered by nav/camera.py as sim_node renders them (128x96 rgb8: the
adapter's encoder sees 128x96, so the frames keep that size), on /camera/image_raw at FRAME_HZ
(sim_node: 15 Hz), "go to the red chair" on /edge_llm/instruction just after the first frame, and
an empty instruction at the end, which ends the navigator's episode. MCAP storage with
zstd-compressed chunks keeps a bag in a few kB. The bag without the camera topic is for the
missing-topic error (`bag play --require`).

expected.json holds, per bag, Navigator.decide's answer (the node's decision path, greedy: the same
frame gives the same answer) to each distinct frame, with the header stamps of the frames that show
it, and the sha256 of the adapter's files. test/runtime/test_nav_replay.py compares what
navigator_node publishes during a replay with it; after the adapter (or the prompt, or the grammar)
changes on purpose, run this again. Stamps are fixed: the same bytes every run.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

OUT = Path(__file__).resolve().parents[2] / "test" / "data" / "nav_bags"
EXPECTED_FILE = "expected.json"
REGENERATE = "python -m edge_llm_ros.tools.nav_bags"
CAMERA = ("/camera/image_raw", "sensor_msgs/msg/Image")
INSTRUCTION = ("/edge_llm/instruction", "std_msgs/msg/String")
GOAL = "go to the red chair"
SEED = 100  # an evaluation world (edge-llm-ros train nav --eval-worlds 100-109)
FRAME_HZ = 5.0
DURATION_S = 5.0  # at 2x replay, 2.5 s: room for one decision (about 1.1 s on 2 cores) and its hand-over
INSTRUCTION_AT_S = 0.1
EPOCH_NS = 1_735_689_600 * 10**9  # 2025-01-01T00:00:00Z: bag time and header stamps start here


@dataclass(frozen=True)
class Scenario:
    name: str
    what: str
    facing: bool  # face the target from the world's start (else the start's own heading: it is out of view)
    verb: str  # the action the scenario is for; a frame answered otherwise fails the tool
    camera: bool = True


SCENARIOS = (
    Scenario("search", "the robot stands at the start, the red chair out of view: a search turn", False,
             "turn_left"),
    Scenario("approach", "the robot stands at the start facing the red chair, 3 m away: forward", True, "forward"),
    Scenario("no_camera", "the instruction alone, no /camera/image_raw: for the missing-topic error", False, "",
             camera=False),
)


# -- the scenario's frames and messages ---------------------------------------------------------------


def scenario_pose(world, scenario: Scenario):
    from edge_llm_ros.nav.world import Pose

    start = world.start
    if not scenario.facing:
        return start
    x, y = world.target_object.position
    return Pose(start.x, start.y, math.atan2(y - start.y, x - start.x))


def start_ns(scenario: Scenario) -> int:
    """Each bag on its own stretch of time, so a frame stamp tells which bag it came from."""
    return EPOCH_NS + 60 * 10**9 * SCENARIOS.index(scenario)


def frame_stamps(scenario: Scenario) -> list[int]:
    return [start_ns(scenario) + round(k * 1e9 / FRAME_HZ) for k in range(round(DURATION_S * FRAME_HZ))]


def image(frame: np.ndarray, stamp_ns: int):
    """sensor_msgs/Image as sim_node publishes it: rgb8, frame `camera`."""
    from edge_llm_ros.runtime.interfaces import registry

    h, w = frame.shape[:2]
    msg = registry().new(CAMERA[1], height=h, width=w, encoding="rgb8", is_bigendian=0, step=3 * w,
                         data=np.frombuffer(frame.tobytes(), dtype=np.uint8))
    msg.header.frame_id = "camera"
    msg.header.stamp.sec, msg.header.stamp.nanosec = divmod(stamp_ns, 10**9)
    return msg


def messages(scenario: Scenario, frame: np.ndarray | None) -> list[tuple[str, str, int, object]]:
    """(topic, type, bag time, message) in time order: frames, the instruction after the first, the
    empty instruction at the end."""
    from edge_llm_ros.runtime.interfaces import registry

    def instruction(text: str, at_ns: int):
        return (*INSTRUCTION, at_ns, registry().new(INSTRUCTION[1], data=text))

    out = [(*CAMERA, ns, image(frame, ns)) for ns in frame_stamps(scenario)] if scenario.camera else []
    out.append(instruction(GOAL, start_ns(scenario) + round(INSTRUCTION_AT_S * 1e9)))
    out.append(instruction("", start_ns(scenario) + round(DURATION_S * 1e9)))
    return sorted(out, key=lambda m: m[2])


def write_bag(path: Path, items: list[tuple[str, str, int, object]]) -> None:
    from edge_llm_ros.runtime.bag import BagWriter
    from edge_llm_ros.runtime.interfaces import registry

    shutil.rmtree(path, ignore_errors=True)
    with BagWriter(path, compression="zstd") as bag:
        for topic, typename, at_ns, msg in items:
            bag.add_topic(topic, typename)
            bag.write(topic, at_ns, registry().serialize(msg, typename))


# -- the expected answers -----------------------------------------------------------------------------


def adapter_fingerprint(folder: Path | None = None) -> dict:
    """The adapter the answers came from: its folder's name and the sha256 of its files."""
    from edge_llm_ros.nav.vlm import ADAPTERS_DIR, CONFIG_FILE, DEFAULT_ADAPTER, WEIGHTS_FILE

    folder = ADAPTERS_DIR / DEFAULT_ADAPTER if folder is None else Path(folder)
    digest = hashlib.sha256()
    for name in (CONFIG_FILE, WEIGHTS_FILE):
        digest.update((folder / name).read_bytes())
    return {"name": folder.name, "sha256": digest.hexdigest()}


def load_navigator():
    """As navigator_node.load builds it for mode ar (the lossless modes give the same answers)."""
    from edge_llm_ros.core.engine.models import load_model
    from edge_llm_ros.nav.navigator import Navigator
    from edge_llm_ros.nav.vlm import NavAdapter

    target = load_model()
    return Navigator(NavAdapter.load(None, target), target)


def decisions(navigator, frame: np.ndarray, stamps: list[int]) -> list[dict]:
    """The answer to each distinct frame, with the stamps of the frames that show it (a robot that
    stands shows one frame)."""
    decision = navigator.decide(frame, GOAL)
    return [{"frame_stamps_ns": stamps, "text": decision.text, "action": decision.command.verb,
             "magnitude": decision.command.magnitude, "valid": decision.valid,
             "confidence": round(decision.confidence, 4)}]


def check_scenario(scenario: Scenario, answers: list[dict]) -> None:
    """A fixture must show what it is for: an answer other than the scenario's verb fails the tool."""
    wrong = [a["text"] for a in answers if a["action"] != scenario.verb or not a["valid"]]
    if wrong:
        raise SystemExit(f"error: {scenario.name}: expected {scenario.verb} ({scenario.what}), the navigator "
                         f"answered {wrong}; choose another pose for this scenario")


# -- the tool -----------------------------------------------------------------------------------------


def record(out: Path) -> dict:
    from edge_llm_ros.nav.camera import Camera
    from edge_llm_ros.nav.worldgen import GenerateConfig, generate

    world, camera, navigator = generate(SEED, GenerateConfig(clear_path=True)), Camera(), load_navigator()
    bags = {}
    for scenario in SCENARIOS:
        pose = scenario_pose(world, scenario)
        frame = camera.render(world, pose) if scenario.camera else None
        answers = decisions(navigator, frame, frame_stamps(scenario)) if scenario.camera else []
        if scenario.camera:
            check_scenario(scenario, answers)
        write_bag(out / scenario.name, messages(scenario, frame))
        bags[scenario.name] = {"what": scenario.what, "world_seed": SEED,
                               "pose": [round(pose.x, 3), round(pose.y, 3), round(pose.yaw, 4)],
                               "decisions": answers}
        print(f"{out / scenario.name}: {scenario.what}"
              + "".join(f"; {a['action']} {a['magnitude']} ({a['confidence']:.2f})" for a in answers), flush=True)
    expected = {"regenerate": REGENERATE, "adapter": adapter_fingerprint(), "instruction": GOAL,
                "frame_hz": FRAME_HZ, "duration_s": DURATION_S, "bags": bags}
    (out / EXPECTED_FILE).write_text(json.dumps(expected, indent=1) + "\n")
    return expected


def load_expected(out: Path = OUT) -> dict:
    return json.loads((out / EXPECTED_FILE).read_text())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m edge_llm_ros.tools.nav_bags", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=OUT, help="folder of the bags and expected.json")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    record(args.out)
    size = sum(p.stat().st_size for p in args.out.rglob("*") if p.is_file())
    print(f"wrote {len(SCENARIOS)} bags and {EXPECTED_FILE} to {args.out} ({size / 1e3:.0f} kB)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
