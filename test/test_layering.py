"""core/ stays middleware-free: no ROS, Zenoh, runtime or nodes import, statically or at run time."""

import ast
import subprocess
import sys
from pathlib import Path

CORE = Path(__file__).resolve().parents[1] / "edge_llm_ros" / "core"
FORBIDDEN = ("rclpy", "zenoh", "zenoh_ros2_sdk", "rosbags", "mcap", "edge_llm_ros.runtime", "edge_llm_ros.nodes",
             "launch", "launch_ros")


def imported_names(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against edge_llm_ros.core
                base = "edge_llm_ros.core" if node.level == 1 else "edge_llm_ros"
                names.add(f"{base}.{node.module}" if node.module else base)
            elif node.module:
                names.add(node.module)
    return names


def test_core_sources_import_no_middleware():
    files = sorted(CORE.rglob("*.py"))
    assert files, "core/ has no modules"
    for path in files:
        for name in imported_names(path):
            assert not any(name == f or name.startswith(f + ".") for f in FORBIDDEN), f"{path.name} imports {name}"


def test_importing_core_loads_no_middleware():
    code = (
        "import sys, edge_llm_ros.core\n"
        f"bad = [m for m in sys.modules if any(m == f or m.startswith(f + '.') for f in {FORBIDDEN!r})]\n"
        "print(bad)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         cwd=CORE.parents[1])
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", out.stdout
