"""The reliability suite runs the product's own harness once: `edge-llm-ros bench --scenario
reliability` as a subprocess (its own launcher, router and nodes, so a killed router touches no
other test), 10,000 fuzz messages, 30 concurrent goals from 3 clients, each peer killed in turn.
The tests read its JSON report and the nodes' log."""

from __future__ import annotations

import json

import pytest
from support import cli, setup_budget

BENCH_TIMEOUT_S = 900


@pytest.fixture(scope="session")
@setup_budget(BENCH_TIMEOUT_S + 60)
def reliability(tmp_path_factory):
    """(report dict, the nodes' log text, the bench's exit code and stderr)."""
    out = tmp_path_factory.mktemp("reliability")
    report, log = out / "reliability.json", out / "reliability.log"
    done = cli("bench", "--scenario", "reliability", "--json", str(report), "--log", str(log),
               timeout=BENCH_TIMEOUT_S)
    assert report.exists(), f"no report (exit {done.returncode}):\n{done.stderr[-3000:]}"
    return json.loads(report.read_text()), log.read_text(errors="replace"), done.returncode, done.stderr
