"""The demo pipeline: an instruction on /edge_llm/instruction comes back as a TokenChunk stream on
/edge_llm/response; the monitor reports stats.

    edge-llm-ros launch pipeline [chunk_words:=3 ...]        # embedded backend, no ROS 2 needed
    ros2 launch edge_llm_ros pipeline.launch.py [chunk_words:=3 ...]

Parameters live in config/pipeline.yaml; every one of them is a launch argument.
"""

CONFIG = "pipeline.yaml"

NODES = [
    {"executable": "echo_node", "name": "echo_node", "namespace": "edge_llm", "required": True},
    {"executable": "monitor_node", "name": "monitor", "namespace": "edge_llm", "required": True},
]


def generate_launch_description():
    from edge_llm_ros.launch_support import describe

    return describe(NODES, CONFIG)
