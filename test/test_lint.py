"""Linting, as part of the suite (issue 27: unreachable code, unused imports and shadowed names
never land):

- ruff on the whole repository, with the rules pyproject.toml selects (pyflakes, bugbear, import
  order);
- mypy on the engine (edge_llm_ros/core/engine), with pyproject.toml's [tool.mypy] settings
  (unreachable code included);
- an AST check over the package and the tests for statements after a return, raise, continue or
  break in the same block, which no ruff rule of the pinned version reports.

ruff and mypy run from this interpreter's environment (``python -m ruff``, ``python -m mypy``:
the versions constraints.txt pins, installed by setup.py's "test" extra). A missing one fails
the test, saying how to install it: a lint that is skipped would let the code it guards land.
"""

from __future__ import annotations

import ast
import importlib.util
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "edge_llm_ros"
ENGINE = PACKAGE / "core" / "engine"
TERMINAL = (ast.Return, ast.Raise, ast.Continue, ast.Break)


def pinned(tool: str) -> str:
    """``tool==version`` as constraints.txt pins it."""
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if line.split("==")[0].strip().lower() == tool:
            return line.strip()
    raise AssertionError(f"constraints.txt pins no version of {tool}")


def run_tool(tool: str, *args: str, timeout: float = 300.0) -> subprocess.CompletedProcess:
    """``python -m tool args`` in the repository root, with this interpreter; fails the test if the
    tool is not installed here."""
    if importlib.util.find_spec(tool) is None:
        pytest.fail(f"{tool} is not installed in this Python environment ({sys.executable}): "
                    f"pip install -c constraints.txt '{pinned(tool)}' (or pip install -e '.[test]' -c constraints.txt)",
                    pytrace=False)
    return subprocess.run([sys.executable, "-m", tool, *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


def unreachable(source: str, filename: str = "<source>") -> list[str]:
    """``line: ...`` for each statement that follows a return, raise, continue or break in the same
    block (the first such statement of each block), in line order."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        for _, value in ast.iter_fields(node):
            if not (isinstance(value, list) and value and all(isinstance(v, ast.stmt) for v in value)):
                continue  # not a block of statements
            for stmt, after in zip(value, value[1:]):
                if isinstance(stmt, TERMINAL):
                    found.append((after.lineno, type(stmt).__name__.lower(), stmt.lineno))
                    break
    return [f"{line}: never runs (after the {kind} on line {exit_line})" for line, kind, exit_line in sorted(found)]


@pytest.mark.slow
@pytest.mark.timeout(360)  # run_tool: up to 300 s
def test_ruff_finds_nothing_in_the_repository():
    result = run_tool("ruff", "check", "--no-cache", "--output-format", "concise", ".")
    assert result.returncode == 0, f"ruff check (pyproject.toml's rules):\n{result.stdout}{result.stderr}"


@pytest.mark.slow
@pytest.mark.timeout(360)  # run_tool: up to 300 s; 120 s on the loaded 2-core machine
def test_mypy_finds_nothing_in_the_engine():
    result = run_tool("mypy", "--cache-dir", str(ROOT / ".mypy_cache"), str(ENGINE.relative_to(ROOT)))
    assert result.returncode == 0, f"mypy on {ENGINE.relative_to(ROOT)}:\n{result.stdout}{result.stderr}"


def test_no_statement_follows_a_return_raise_continue_or_break():
    files = sorted([*PACKAGE.rglob("*.py"), *(ROOT / "test").rglob("*.py")])
    found = [f"{path.relative_to(ROOT)}:{line}" for path in files
             for line in unreachable(path.read_text(), str(path))]
    assert not found, "unreachable statements:\n" + "\n".join(found)


def test_the_unreachable_check_finds_a_statement_after_each_kind_of_exit():
    source = textwrap.dedent('''
        class Params:
            @property
            def qwen(self):
                return True
                if self.mode:  # line 6: the shape of issue 27's bug
                    raise ValueError("never checked")

        def f(items):
            for item in items:
                if item:
                    continue
                    print("after continue")  # line 13
                else:
                    break
                    print("after break")  # line 16
            try:
                raise KeyError
                x = 1  # line 19
            except KeyError:
                raise
                y = 2  # line 22
            finally:
                return 0
                z = 3  # line 25
    ''')
    assert unreachable(source) == [
        "6: never runs (after the return on line 5)",
        "13: never runs (after the continue on line 12)",
        "16: never runs (after the break on line 15)",
        "19: never runs (after the raise on line 18)",
        "22: never runs (after the raise on line 21)",
        "25: never runs (after the return on line 24)",
    ]


def test_the_unreachable_check_passes_code_whose_exits_end_their_blocks():
    source = textwrap.dedent('''
        def f(x):
            if x:
                return 1
            elif x is None:
                raise ValueError("none")
            while x:
                if x > 3:
                    break
                x -= 1
            return x
    ''')
    assert unreachable(source) == []
