"""`edge-llm-ros top` (a table of the nodes' statuses on /diagnostics) and `edge-llm-ros plot` (tokens/s,
TTFT and tau over time from a bag's InferenceStats), each run as a separate process."""

from __future__ import annotations

import struct
import time
import uuid
from pathlib import Path

import pytest
from support import cli

pytestmark = pytest.mark.slow  # each test runs the CLI as a process

SHARED = Path(__file__).resolve().parents[3] / "shared"
TALKER_BAG = SHARED / "testdata" / "ros2_bags" / "talker_mcap"  # written by a real rosbag2: a talker, no stats


def write_stats_bag(path: Path, rows: list[dict]) -> None:
    """A bag of InferenceStats on /edge_llm/stats, one message a second (CDR by rosbags' serializer)."""
    from edge_llm_ros.runtime.bag import BagWriter
    from edge_llm_ros.runtime.interfaces import registry

    Stats = registry().message_class("edge_llm_ros/msg/InferenceStats")
    start = time.time_ns()
    with BagWriter(path) as bag:
        bag.add_topic("/edge_llm/stats", "edge_llm_ros/msg/InferenceStats")
        for i, row in enumerate(rows):
            data = registry().serialize(Stats(**row), "edge_llm_ros/msg/InferenceStats")
            bag.write("/edge_llm/stats", start + i * 1_000_000_000, data)


def png_size(path: Path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n", head
    return struct.unpack(">II", head[16:24])


def test_plot_draws_tokens_per_s_ttft_and_tau_per_node_and_mode(tmp_path):
    rows = [dict(node_name="serve_node", mode="ar", request_id=f"r{i}", tokens=32, tokens_per_s=10.0 + i,
                 ttft_s=0.2, tau=1.0) for i in range(3)]
    rows += [dict(node_name="draft_node", mode="ee", request_id=f"d{i}", tokens=64, tokens_per_s=20.0,
                  ttft_s=0.1 * (i + 1), tau=2.0 + i) for i in range(3)]
    rows.append(dict(node_name="serve_node", mode="", tokens=0))  # an aggregate of an idle period: left out
    write_stats_bag(tmp_path / "run", rows)
    out = cli("plot", str(tmp_path / "run"), "--out", str(tmp_path / "run.png"))
    assert out.returncode == 0, out.stderr
    table = {tuple(line.split()[:2]): line.split()[2:] for line in out.stdout.splitlines()[1:3]}
    assert table == {("draft_node", "ee"): ["3", "20.00", "0.200", "3.00"],
                     ("serve_node", "ar"): ["3", "11.00", "0.200", "1.00"]}, out.stdout
    assert png_size(tmp_path / "run.png") == (900, 700)


def test_plot_refuses_a_bag_without_stats_and_a_missing_bag_naming_them(tmp_path):
    out = cli("plot", str(TALKER_BAG))
    assert out.returncode == 2
    assert out.stderr.strip() == (f"edge-llm-ros plot: error: {TALKER_BAG}: no edge_llm_ros/msg/InferenceStats topic "
                                  "(topics: /topic, /rosout, /parameter_events)"), out.stderr
    out = cli("plot", str(tmp_path / "nothing"))
    assert out.returncode == 2 and out.stderr.startswith("edge-llm-ros plot: error: ") and "nothing" in out.stderr


def test_top_once_shows_each_status_with_its_numbers_and_the_silent_nodes(rt_session):
    from edge_llm_ros.nodes.diagnostics import WARN, Updater

    tag = uuid.uuid4().hex[:6]
    serving = rt_session.Node(f"serve_node_{tag}", namespace="/top_test")
    silent = rt_session.Node(f"silent_{tag}", namespace="/top_test")
    try:
        updater = Updater(serving, hardware_id=f"/top_test/serve_node_{tag} (local)")

        def requests(status) -> None:
            status.summary(WARN, "2 busy refusal(s) in the last 1 s")
            for key, value in (("lifecycle state", "active"), ("running", 3), ("waiting", 1),
                               ("tokens/s per request (last 60 s)", 12.34), ("tau (last 60 s)", 2.5),
                               ("draft-to-final p50 s (last 60 s)", 0.081)):
                status.add(key, value)

        updater.add("requests", requests)
        out = cli("top", "--once", "--wait", "3")
        assert out.returncode == 0, out.stderr
        lines = out.stdout.splitlines()
        assert lines[0].split() == ["NODE", "LEVEL", "STATE", "TOK/S", "RUN", "WAIT", "TAU", "RTT", "ms", "AGE", "s",
                                    "LAST", "ERROR"]
        row = next(line for line in lines if line.startswith(f"serve_node_{tag}/requests"))
        cells = row.split()
        assert cells[1:8] == ["WARN", "active", "12.3", "3", "1", "2.50", "81"], row
        assert "2 busy refusal(s) in the last 1 s (" in row and row.endswith("s ago)")
        assert any(line.startswith(f"/top_test/silent_{tag}") and "(publishes no status)" in line for line in lines)
    finally:
        silent.destroy_node()
        serving.destroy_node()


def test_top_refuses_bad_options():
    out = cli("top", "--once", "--interval", "0")
    assert out.returncode == 2 and out.stderr.strip() == "edge-llm-ros top: error: --interval must be > 0 and --wait >= 0"


@pytest.fixture(autouse=True)
def _router(router_endpoint):
    """The session's router (its endpoint exported for the CLI processes)."""
