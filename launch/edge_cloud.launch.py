"""Edge-cloud decoding with early exits: draft_node (robot) and verifier_node (server) as two
processes, over an emulated 25 ms one-way, 100 Mbit/s link each way (config/edge_cloud.yaml).

    edge-llm-ros launch edge_cloud [gamma:=3 link_emulation.uplink.latency_ms:=50.0 ...]
    ros2 launch edge_llm_ros edge_cloud.launch.py
    edge-llm-ros action send_goal /edge_llm/generate edge_llm_ros/action/Generate "{prompt: 'hello robot'}"

Parameters live in config/edge_cloud.yaml; every one of them is a launch argument.

A peer that dies does not take the deployment down: the verifier (server side)
is started again 1 s after it exits, and so is the draft node (robot side,
the front door for Generate goals), as often as it takes, under both
launchers. Goals in flight when a peer dies end with an error (never hang). If the Zenoh router dies, `edge-llm-ros launch` starts a new one at
the same endpoint and the nodes' sessions reconnect to it; if none can be
started, the launch stops with exit code 1. Ctrl-C stops everything; nothing
is respawned during shutdown.
"""

CONFIG = "edge_cloud.yaml"

NODES = [
    {"executable": "verifier_node", "name": "verifier_node", "namespace": "edge_llm", "lifecycle": True,
     "required": False, "respawn": True, "respawn_delay": 1.0},
    {"executable": "draft_node", "name": "draft_node", "namespace": "edge_llm", "lifecycle": True,
     "required": False, "respawn": True, "respawn_delay": 1.0},
]


def generate_launch_description():
    from edge_llm_ros.launch_support import describe

    return describe(NODES, CONFIG)
