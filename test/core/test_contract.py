"""core/ states its contract: every module's docstring says what it is (STYLE.md: "state the
module's contract in its docstring"). That core/ knows nothing of ROS is test/test_layering.py's to
check, from what each module imports, statically and at run time, not from what its docstring says."""

import ast
from pathlib import Path

import edge_llm_ros.core as core

MODULES = sorted(Path(core.__file__).parent.rglob("*.py"))


def test_every_core_module_states_its_contract_in_a_docstring():
    assert len(MODULES) >= 40
    missing = [str(path) for path in MODULES if not ast.get_docstring(ast.parse(path.read_text()))]
    assert missing == [], f"modules without a docstring: {missing}"
