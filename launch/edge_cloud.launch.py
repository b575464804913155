"""Edge-cloud decoding with early exits: draft_node (robot) and verifier_node (server) as two
processes, over an emulated 25 ms one-way, 100 Mbit/s link each way (config/edge_cloud.yaml).

    edge-llm-ros launch edge_cloud [gamma:=3 link_emulation.uplink.latency_ms:=50.0 ...]
    ros2 launch edge_llm_ros edge_cloud.launch.py
    edge-llm-ros action send_goal /edge_llm/generate edge_llm_ros/action/Generate "{prompt: 'hello robot'}"

Parameters live in config/edge_cloud.yaml; every one of them is a launch argument.
"""

CONFIG = "edge_cloud.yaml"

NODES = [
    {"executable": "verifier_node", "name": "verifier_node", "namespace": "edge_llm", "required": True},
    {"executable": "draft_node", "name": "draft_node", "namespace": "edge_llm", "required": True},
]


def generate_launch_description():
    from edge_llm_ros.launch_support import describe

    return describe(NODES, CONFIG)
