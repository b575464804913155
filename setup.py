"""pip install path for machines without ROS 2 (colcon uses CMakeLists.txt)."""

from pathlib import Path

from setuptools import find_packages, setup

PACKAGE = "edge_llm_ros"
here = Path(__file__).parent


def share(folder: str, pattern: str = "*") -> tuple[str, list[str]]:
    return (f"share/{PACKAGE}/{folder}", [str(p) for p in sorted((here / folder).glob(pattern)) if p.is_file()])


setup(
    name=PACKAGE,
    version="0.1.0",
    description="Fast lossless LLM/VLM inference for ROS 2 robots: draft on the robot, target on peers, speculative decoding",
    packages=find_packages(include=[PACKAGE, f"{PACKAGE}.*"]),
    package_data={PACKAGE: ["data/**/*"]},  # shipped prompts and trained drafters
    python_requires=">=3.10",
    install_requires=[
        "numpy>=1.26",
        "pyyaml>=6",
        "eclipse-zenoh>=1.0,<2",
        "zenoh-ros2-sdk>=0.1.8",
        "rosbags>=0.11",
        "mcap>=1.6",
        "tqdm>=4.60",
        "opencv-python-headless>=4.8",  # the simulator's camera, the navigator's frames
        "cryptography>=42",  # keystores: the CA and each enclave's certificate (runtime/security.py)
    ],
    extras_require={
        "engine": ["torch>=2.4", "transformers>=4.46", "gguf>=0.10", "accelerate>=1.0", "safetensors>=0.4"],
        # Qwen2-VL / Qwen2.5-VL preprocessing (nav/qwen_vl.py): qwen-vl-utils imports torchvision,
        # which must be built for the installed torch (the Makefile's `vlm` venv says why it has its own).
        "vlm": ["qwen-vl-utils>=0.0.14", "torchvision"],
        # edge-llm-ros bench --png; websockets: bench --scenario serving --foxglove's client of the bridge
        "bench": ["matplotlib>=3.8", "websockets>=13"],
        "foxglove": ["foxglove-sdk>=0.30,<0.31"],  # foxglove_bridge_node (foxglove:=true): its WebSocket server
        "cpu": ["llama-cpp-python>=0.3.36"],  # the llama.cpp backend (make install builds it: see the Makefile)
        # ruff and mypy: test/test_lint.py runs them (versions: constraints.txt)
        "test": ["pytest>=8", "pytest-timeout>=2", "pytest-xdist>=3.6", "ruff>=0.17.6", "mypy>=2.4",
                 # llama-cpp-python's `server` extra, named here (not as llama-cpp-python[server], which would
                 # build llama.cpp before make install builds it its own way): test_remote_backend starts
                 # `python -m llama_cpp.server` as the OpenAI-compatible server the remote backend talks to
                 "fastapi>=0.100", "uvicorn>=0.22", "pydantic-settings>=2.0.1", "sse-starlette>=1.6.1",
                 "starlette-context>=0.3.6,<0.4"],
    },
    data_files=[
        (f"share/{PACKAGE}", ["package.xml"]),
        share("msg", "*.msg"),
        share("srv", "*.srv"),
        share("action", "*.action"),
        share("launch", "*.py"),
        share("config", "*.yaml"),
        share("config", "*.rviz"),  # rviz2 (go2_sim.launch.py rviz:=true)
        share("config", "*.perspective"),  # rqt --perspective-file
        share("config/worlds", "*.yaml"),
        share("config/foxglove", "*.json"),  # the Foxglove app's layout (Import layout)
        share("config/security", "*.xml"),  # the shipped SROS2 policies (edge-llm-ros security create)
        # vendored interface packages (runtime/interfaces.py VENDORED): their msg/ for the embedded backend
        ("share/unitree_api/msg", [str(p) for p in sorted((here / "interfaces/unitree_api/msg").glob("*.msg"))]),
        ("share/ament_index/resource_index/packages", [f"resource/{PACKAGE}"]),
    ],
    entry_points={
        "console_scripts": [
            "edge-llm-ros = edge_llm_ros.cli:main",
        ],
    },
)
