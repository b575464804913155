"""The Go2 navigation demo on the simulator (issue 15): sim_node (world, kinematic Go2, camera),
navigator_node (frames + instruction -> NavAction through the VLM) and go2_bridge_node (NavAction
-> /cmd_vel within limits, watchdog, e-stop), on either runtime.

    edge-llm-ros launch go2_sim [world:=seeded seed:=7 mode:=ar overlap:=true ...]
    ros2 launch edge_llm_ros go2_sim.launch.py
    edge-llm-ros topic pub --once /edge_llm/instruction std_msgs/msg/String "{data: 'go to the red chair'}"

Parameters live in config/go2_sim.yaml; every one of them is a launch argument (one shared by
two nodes, such as max_frame_age_s, sets both). The navigator is a lifecycle node (it loads the
VLM on configure); a node that dies is started again after 1 s, and the bridge stops the robot
when the navigator goes quiet (its watchdog).
"""

CONFIG = "go2_sim.yaml"

NODES = [
    {"executable": "sim_node", "name": "sim", "namespace": "", "required": False, "respawn": True,
     "respawn_delay": 1.0},
    {"executable": "go2_bridge_node", "name": "go2_bridge", "namespace": "edge_llm", "required": False,
     "respawn": True, "respawn_delay": 1.0},
    {"executable": "navigator_node", "name": "navigator", "namespace": "edge_llm", "lifecycle": True,
     "required": False, "respawn": True, "respawn_delay": 1.0},
]


def generate_launch_description():
    from edge_llm_ros.launch_support import describe

    return describe(NODES, CONFIG)
