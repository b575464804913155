"""Pipeline stages (issue 14): the target split by decoder layers, one stage_node process per range.

    edge-llm-ros launch stages [layers:=0-10,11-29 wire_dtype:=float16 ...]
    ros2 launch edge_llm_ros stages.launch.py [layers:=0-7,8-19,20-29 ...]
    ros2 launch edge_llm_ros stages.launch.py plan:=~/.config/edge_llm_ros/pipeline_plan.yaml

`layers` gives every stage's decoder layers, inclusive, in order (up to MAX_STAGES ranges). Stage i
is the node /edge_llm/stage_<i>: it reads rows on /edge_llm/stage_<i>/in and writes what its layers
make on /edge_llm/stage_<i+1>/in, so the scheduler feeds token ids to /edge_llm/stage_0/in and reads
the target's greedy tokens (or logits, `output:=logits`) on /edge_llm/stage_<count>/in. Errors come
back on /edge_llm/verify. Parameters live in config/stages.yaml; every shared one is a launch argument.
`plan:=FILE` layers a plan that `edge-llm-ros plan --pipeline` wrote over config/stages.yaml (its
layers, mode, segment, in_flight, prefill chunk); launch arguments still override it, and a plan
whose planned values were edited since is refused (its predictions no longer hold).

draft_node is D0 (FlowSpec): the front door (the `generate` action, `instruction` -> `response`),
the draft, and the scheduler (modes flowspec, chunk_pp, ar). NODES lists MAX_STAGES stage slots
(each slot's `index` is in config/stages.yaml); select_nodes starts as many as `layers` gives
ranges, and draft_node, under both launchers, and refuses ranges with a gap or an overlap before
anything starts. A node that dies is started again after 1 s (the requests it held fail with an
error meanwhile, never hang).
"""

CONFIG = "stages.yaml"
OVERLAY = "plan"  # the launch argument naming a params file layered over CONFIG
MAX_STAGES = 8

NODES = [{"executable": "stage_node", "name": f"stage_{index}", "namespace": "edge_llm", "lifecycle": True,
          "required": False, "respawn": True, "respawn_delay": 1.0} for index in range(MAX_STAGES)]
NODES.append({"executable": "draft_node", "name": "draft_node", "namespace": "edge_llm", "lifecycle": True,
              "required": False, "respawn": True, "respawn_delay": 1.0})


def read_plan(path: str):
    """The core.planning.pipeline_plan.PipelinePlan that `plan:=` names; ValueError if the file is missing, is no
    plan `edge-llm-ros plan --pipeline` wrote, or was edited since."""
    from pathlib import Path

    from edge_llm_ros.core.planning.pipeline_plan import PipelinePlan

    try:
        return PipelinePlan.from_yaml(Path(path).expanduser().read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"{OVERLAY}:={path}: {exc}") from None


def select_nodes(arguments: dict[str, str]) -> list[str]:
    """The slots `layers` asks for; ValueError for a gap, an overlap, too many stages, or a bad `plan`."""
    from edge_llm_ros.core.planning.partition import check_ranges, layer_ranges

    if arguments.get(OVERLAY):
        read_plan(arguments[OVERLAY])
    text = arguments["layers"]
    ranges = layer_ranges(text)
    if not 1 <= len(ranges) <= MAX_STAGES:
        raise ValueError(f"layers:={text} gives {len(ranges)} stages; this launch file runs 1 to {MAX_STAGES}")
    try:
        check_ranges(ranges, ranges[-1].stop)  # a gap or an overlap, named; the model's end: the last stage's
    except ValueError as exc:
        raise ValueError(f"layers:={text}: {exc}") from None
    return [f"stage_{index}" for index in range(len(ranges))] + ["draft_node"]


def generate_launch_description():
    import os

    from launch.actions import DeclareLaunchArgument, OpaqueFunction

    from edge_llm_ros.launch_support import config_path, describe
    from edge_llm_ros.runtime.params import load_params_file
    from launch import LaunchDescription

    def stages(context):
        configs = context.launch_configurations
        plan = os.path.expanduser(configs.get(OVERLAY, ""))
        overlays = [plan] if plan else []
        if not configs.get("layers"):  # the plan's, else config/stages.yaml's
            configs["layers"] = read_plan(plan).layers if plan else default
        chosen = select_nodes({"layers": configs["layers"], OVERLAY: plan})
        return describe([n for n in NODES if n["name"] in chosen], CONFIG, overlays).entities

    default = load_params_file(config_path(CONFIG), "/edge_llm/stage_0")["layers"]
    return LaunchDescription([
        DeclareLaunchArgument(OVERLAY, default_value="",
                              description="a plan from `edge-llm-ros plan --pipeline` (a params file), layered over "
                                          f"{CONFIG}; launch arguments still override it"),
        DeclareLaunchArgument("layers", default_value="",
                              description="every stage's decoder layers, inclusive, e.g. 0-10,11-29 (default: the "
                                          f"plan's, else {CONFIG}'s {default})"),
        OpaqueFunction(function=stages),
    ])
