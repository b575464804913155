"""Layering: the arrows of docs/architecture.md, read from every module's imports.

- core/ is split by concern and each part imports only the parts below it (ALLOWED);
- inference never imports training (core/training, nav/vlm_training): only training code and the
  command-line tools do;
- core/ and nav/ stay middleware-free (no ROS, Zenoh, runtime or nodes import, statically or at run
  time); runtime/ knows nothing of core, nodes or tools; only the CLI imports the command-line tools
  (tools are leaves: they define no product logic);
- no module imports itself back through others (no import cycle).

Imports are read from the source (function-local ones included), so a lazy import counts as much
as one at the top.
"""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "edge_llm_ros"
ROOT = "edge_llm_ros"
MIDDLEWARE = ("rclpy", "zenoh", "zenoh_ros2_sdk", "rosbags", "mcap", "launch", "launch_ros")
TRAINING = ("core.training", "nav.vlm_training")

# what each part may import of this package (besides itself, the package root's DATA, edge_llm_ros.errors
# (how a request ends, which every layer may raise) and edge_llm_ros.modes (the mode registry))
CORE_BELOW = {
    "core.engine": (),
    "core.drafts": ("core.engine",),
    "core.pipeline": ("core.engine",),
    "core.edge_cloud": ("core.engine", "core.drafts"),
    "core.training": ("core.engine", "core.drafts"),
    "core.planning": ("core.engine", "core.drafts", "core.pipeline"),
    "core.sim": ("core.engine", "core.drafts", "core.pipeline", "core.edge_cloud", "core.planning"),
}
CORE = tuple(p for p in CORE_BELOW if p != "core.training")  # what inference may import of core
ALLOWED = {
    **CORE_BELOW,
    "core": (),
    "errors": (),
    "modes": (),
    "nav": CORE,
    "runtime": (),
    "client": ("runtime",),
    "nodes": (*CORE, "nav", "runtime", "client"),
    "tools": (*CORE_BELOW, "nav", "runtime", "client", "nodes", "demo"),
    "demo": ("runtime", "client", "core.engine", "core.drafts"),
    "cli": ("tools", "demo", "runtime"),
    "launch_support": ("runtime",),
}


def module_of(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_of(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imports_of(module: str) -> set[str]:
    """The modules ``module`` imports: relative imports resolved, ``from pkg import sub`` read as
    ``pkg.sub`` when that is a module, and names spelled as strings (``import_module(f"...")``)."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))
            subs = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in MODULES]
            names.update(subs if len(subs) == len(node.names) else [base, *subs])
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.rstrip(".") in MODULES:
            names.add(node.value.rstrip("."))
    names.discard(module)
    return names


def part_of(name: str) -> str:
    """core.<part> for core's modules, else the top-level module or package under edge_llm_ros."""
    parts = name.split(".")[1:]
    if parts[:1] == ["core"] and len(parts) > 1:
        return ".".join(parts[:2])
    if name.startswith(f"{ROOT}.nav.vlm_training"):
        return "nav.vlm_training"
    return parts[0] if parts else ""


def within(name: str, prefixes) -> bool:
    return any(name == f"{ROOT}.{p}" or name.startswith(f"{ROOT}.{p}.") for p in prefixes)


OWN = [m for m in MODULES if part_of(m) not in ("", "msg", "srv", "action")]


@pytest.mark.parametrize("module", OWN)
def test_a_module_imports_only_what_lies_below_it(module):
    part = part_of(module)
    allowed = ALLOWED["nav" if part == "nav.vlm_training" else part] + (("core.training",) if part == "nav.vlm_training"
                                                                        else ())
    for name in imports_of(module):
        if not name.startswith(ROOT + ".") or part_of(name) in ("", "errors", "modes", part) or name == f"{ROOT}.nav":
            continue
        if part == "nav.vlm_training" and within(name, ("nav",)):
            continue
        if part == "nav" and part_of(name) == "nav.vlm_training":
            continue  # caught below: inference never imports training
        assert within(name, allowed), f"{module} ({part}) imports {name}: {part} may import {', '.join(allowed) or 'nothing of the package'}"


@pytest.mark.parametrize("module", [m for m in OWN if part_of(m) not in ("tools", "cli", *TRAINING)])
def test_inference_never_imports_training(module):
    bad = [n for n in imports_of(module) if within(n, TRAINING)]
    assert not bad, f"{module} imports {bad}: only training code and the command-line tools may"


def test_tools_are_leaves_so_they_hold_no_product_logic():
    """Only the CLI entry point imports the command-line tools: a node, the client, core, nav or the
    runtime that needed something of a tool would be running product logic written there."""
    users = sorted({m for m in OWN if part_of(m) not in ("tools", "cli")
                    for n in imports_of(m) if within(n, ("tools",))})
    assert not users, f"{users} import edge_llm_ros.tools: move what they need out of the tool"


@pytest.mark.parametrize("module", [m for m in OWN if part_of(m).startswith(("core", "nav"))])
def test_core_and_nav_import_no_middleware(module):
    bad = [n for n in imports_of(module) if any(n == f or n.startswith(f + ".") for f in MIDDLEWARE)]
    assert not bad, f"{module} imports {bad}"


def test_no_import_cycles():
    graph = {m: {n for n in imports_of(m) if n in MODULES} for m in MODULES}
    index, low, stack, on_stack, cycles, counter = {}, {}, [], set(), [], [0]

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10 * len(graph)))
    for module in graph:
        if module not in index:
            visit(module)
    assert not cycles, f"import cycles: {cycles}"


@pytest.mark.slow
@pytest.mark.timeout(360)
def test_importing_core_and_nav_loads_no_middleware():
    code = (
        "import sys, importlib, pkgutil, edge_llm_ros.core, edge_llm_ros.nav\n"
        "for pkg in (edge_llm_ros.core, edge_llm_ros.nav):\n"
        "    for m in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + '.'):\n"
        "        importlib.import_module(m.name)\n"
        f"bad = [m for m in sys.modules if any(m == f or m.startswith(f + '.') for f in {MIDDLEWARE!r})]\n"
        "print(bad)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         cwd=PACKAGE.parent)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout
