"""core/ is the engine: no ROS, no middleware, no nodes."""

import ast
from pathlib import Path

import edge_llm_ros.core as core

FORBIDDEN = ("rclpy", "zenoh", "rosbags", "edge_llm_ros.runtime", "edge_llm_ros.nodes")


def imported_modules(path):
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                yield node.module or ""
            elif node.level >= 2:  # a relative import climbing out of core/
                yield "edge_llm_ros." + (node.module or "")


def test_core_imports_nothing_from_ros_or_the_middleware():
    files = sorted(Path(core.__file__).parent.glob("*.py"))
    assert len(files) >= 8
    for path in files:
        for name in imported_modules(path):
            assert not name.startswith(FORBIDDEN), f"{path.name} imports {name}"
        assert "ROS" in ast.get_docstring(ast.parse(path.read_text())), f"{path.name}: docstring states no ROS"
