"""Layering: core/ stays middleware-free (no ROS, Zenoh, runtime or nodes import, statically or at run
time); nodes/ and runtime/ never import the command-line tools (edge_llm_ros.tools)."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "edge_llm_ros"
CORE = PACKAGE / "core"
FORBIDDEN = ("rclpy", "zenoh", "zenoh_ros2_sdk", "rosbags", "mcap", "edge_llm_ros.runtime", "edge_llm_ros.nodes",
             "launch", "launch_ros")
TOOLS = ("edge_llm_ros.tools",)


def imported_names(path: Path) -> set[str]:
    """The modules ``path`` imports (relative imports resolved against its package), and the module
    names it spells as strings (``importlib.import_module(f"edge_llm_ros.tools.{verb}")``)."""
    package = ".".join(path.relative_to(PACKAGE.parent).parent.parts)
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: `.` is the file's package, `..` its parent, ...
                base = package.rsplit(".", node.level - 1)[0]
                names.add(f"{base}.{node.module}" if node.module else base)
            elif node.module:
                names.add(node.module)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("edge_llm_ros."):
            names.add(node.value.rstrip("."))
    return names


def assert_imports_none_of(folder: Path, forbidden: tuple[str, ...]) -> None:
    files = sorted(folder.rglob("*.py"))
    assert files, f"{folder.name}/ has no modules"
    for path in files:
        for name in imported_names(path):
            assert not any(name == f or name.startswith(f + ".") for f in forbidden), \
                f"{path.relative_to(PACKAGE)} imports {name}"


def test_core_sources_import_no_middleware():
    assert_imports_none_of(CORE, FORBIDDEN)


@pytest.mark.parametrize("layer", ["nodes", "runtime"])
def test_nodes_and_runtime_import_no_tools(layer):
    assert_imports_none_of(PACKAGE / layer, TOOLS)


def test_importing_core_loads_no_middleware():
    code = (
        "import sys, edge_llm_ros.core\n"
        f"bad = [m for m in sys.modules if any(m == f or m.startswith(f + '.') for f in {FORBIDDEN!r})]\n"
        "print(bad)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         cwd=PACKAGE.parent)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", out.stdout
