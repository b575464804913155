"""The pipeline: SmolLM2 served to every client on this machine. An instruction on
/edge_llm/instruction comes back as a TokenChunk stream on /edge_llm/response; the
/edge_llm/generate action streams the same text; the monitor reports stats.

    edge-llm-ros launch pipeline [max_requests:=8 engine:=torch ...]   # embedded backend, no ROS 2 needed
    ros2 launch edge_llm_ros pipeline.launch.py [max_requests:=8 ...]

planner_node publishes the device plan on /edge_llm/plan (latched; it calibrates this device
first, in under a minute, if no plan is saved) and answers /edge_llm/plan and /edge_llm/profile;
serve_node runs what the plan names (on a 2-core CPU: ar on llama.cpp, batching concurrent
requests) and switches when a new plan arrives. Both are managed (lifecycle) nodes, brought to
active by themselves here and by the launch under `ros2 launch`: planner_node is active once the
plan is published, serve_node once it serves (`edge-llm-ros lifecycle get /edge_llm/planner_node`,
or `ros2 lifecycle get`). Parameters live in config/pipeline.yaml; every one of them is a launch
argument.
"""

CONFIG = "pipeline.yaml"

NODES = [
    {"executable": "planner_node", "name": "planner_node", "namespace": "edge_llm", "lifecycle": True, "required": True},
    {"executable": "serve_node", "name": "serve_node", "namespace": "edge_llm", "lifecycle": True, "required": True},
    {"executable": "monitor_node", "name": "monitor", "namespace": "edge_llm", "required": True},
]


def generate_launch_description():
    from edge_llm_ros.launch_support import describe

    return describe(NODES, CONFIG)
