"""core/ states its contract: every module's docstring says what it is, and that it knows nothing
about ROS (test/test_layering.py checks that its imports agree)."""

import ast
from pathlib import Path

import edge_llm_ros.core as core

MODULES = sorted(Path(core.__file__).parent.rglob("*.py"))


def test_every_core_module_says_it_knows_nothing_of_ros():
    assert len(MODULES) >= 40
    for path in MODULES:
        doc = ast.get_docstring(ast.parse(path.read_text()))
        assert doc, f"{path}: no docstring"
        assert "ROS" in doc, f"{path}: the docstring does not state that it knows nothing of ROS"
