"""The Go2 navigation demo on the simulator (issue 15): sim_node (world, kinematic Go2, camera),
navigator_node (frames + instruction -> NavAction through the VLM) and go2_bridge_node (NavAction
-> /cmd_vel within limits, watchdog, e-stop), on either runtime.

    edge-llm-ros launch go2_sim [world:=seeded seed:=7 mode:=ar overlap:=true deployment:=edge_cloud ...]
    ros2 launch edge_llm_ros go2_sim.launch.py
    edge-llm-ros topic pub --once /edge_llm/instruction std_msgs/msg/String "{data: 'go to the red chair'}"

`deployment:=edge_cloud` also starts verifier_node (the server: SmolLM2 + the navigation adapter,
task nav) and the navigator keeps only the draft, over an emulated 50 ms RTT link (both in the
params file); `deployment:=pipeline` starts two stage_nodes instead (SmolLM2's layers 0-14 and
15-29, each with the adapter's share, task nav) and the navigator drives them as D0 (mode ar,
chunk_pp or flowspec); `robot` (the default) runs the whole VLM in the navigator.

`rviz:=true` opens config/go2_sim.rviz in rviz2 (the camera, /tf, the world's markers, the robot's
path, the goal, and the navigator's decision above the robot) where rviz2 is installed.

Parameters live in config/go2_sim.yaml; every one of them is a launch argument (one shared by
two nodes, such as max_frame_age_s, sets both). The navigator is a lifecycle node (it loads the
VLM on configure); a node that dies is started again after 1 s, and the bridge stops the robot
when the navigator goes quiet (its watchdog).
"""

CONFIG = "go2_sim.yaml"
RVIZ = "go2_sim.rviz"  # rviz:=true opens it (rviz2 under ROS 2; the embedded launcher says how)

NODES = [
    {"executable": "sim_node", "name": "sim", "namespace": "", "required": False, "respawn": True,
     "respawn_delay": 1.0},
    {"executable": "go2_bridge_node", "name": "go2_bridge", "namespace": "edge_llm", "required": False,
     "respawn": True, "respawn_delay": 1.0},
    {"executable": "navigator_node", "name": "navigator", "namespace": "edge_llm", "lifecycle": True,
     "required": False, "respawn": True, "respawn_delay": 1.0},
    {"executable": "verifier_node", "name": "verifier_node", "namespace": "edge_llm", "lifecycle": True,
     "required": False, "respawn": True, "respawn_delay": 1.0},
    *({"executable": "stage_node", "name": f"stage_{i}", "namespace": "edge_llm", "lifecycle": True,
       "required": False, "respawn": True, "respawn_delay": 1.0} for i in range(2)),
]
DEPLOYMENTS = {"robot": (), "edge_cloud": ("verifier_node",), "pipeline": ("stage_0", "stage_1")}
SERVERS = {name for names in DEPLOYMENTS.values() for name in names}


def select_nodes(arguments: dict[str, str]) -> list[str]:
    """sim, bridge and navigator, and the deployment's servers: the verifier (`deployment:=edge_cloud`)
    or the stages (`pipeline`); ValueError for another deployment."""
    deployment = arguments.get("deployment", "robot")
    if deployment not in DEPLOYMENTS:
        raise ValueError(f"deployment:={deployment}: must be one of {' | '.join(DEPLOYMENTS)}")
    return [n["name"] for n in NODES if n["name"] not in SERVERS or n["name"] in DEPLOYMENTS[deployment]]


def generate_launch_description():
    from launch.actions import DeclareLaunchArgument, OpaqueFunction

    from edge_llm_ros.launch_support import describe, rviz
    from launch import LaunchDescription

    def nodes(context):
        chosen = select_nodes({"deployment": context.launch_configurations.get("deployment", "robot")})
        return describe([n for n in NODES if n["name"] in chosen], CONFIG).entities

    return LaunchDescription([
        DeclareLaunchArgument("deployment", default_value="robot",
                              description="robot: the VLM in the navigator; edge_cloud: the draft there, the "
                                          "target on verifier_node; pipeline: the draft there, the target's "
                                          "layers on two stage_nodes"),
        OpaqueFunction(function=nodes),
        *rviz(RVIZ),
    ])
