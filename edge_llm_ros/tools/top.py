"""`edge-llm-ros top`: a live table of the graph's nodes, from what they say on /diagnostics.

    edge-llm-ros top                 # refreshed every second, like htop (Ctrl-C ends it)
    edge-llm-ros top --once          # listen --wait seconds, print one table, exit (1: nothing heard)

Every node of the package publishes its status on /diagnostics (nodes/diagnostics.py) with its
numbers as key-values; `top` only subscribes, so it never slows or blocks a node. A row per status:
its level (STALE when nothing came for 3 seconds), lifecycle state, tokens/s, requests running and
waiting, tau, the edge-cloud draft-to-final time (RTT), and the last error or warning it reported.
Nodes in the graph that publish no status are listed after them. It runs on the embedded backend
(Zenoh, rmw_zenoh's wire), as the other `edge-llm-ros` graph verbs do.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import threading
import time
from dataclasses import dataclass

from edge_llm_ros.nodes.diagnostics import LEVEL_NAMES, level_of

STALE_S = 3.0  # a status older than this shows as STALE (3 periods of diagnostic_updater's default 1 s)
COLUMNS = (("NODE", 28), ("LEVEL", 5), ("STATE", 12), ("TOK/S", 7), ("RUN", 4), ("WAIT", 4), ("TAU", 5),
           ("RTT ms", 7), ("AGE s", 5), ("LAST ERROR", 0))


@dataclass
class Row:
    name: str  # the status's name, '<node>: <task>'
    hardware_id: str
    level: int
    message: str
    values: dict[str, str]
    heard_at: float  # time.monotonic()
    last_error: str = ""  # the last message at WARN or worse, with when
    last_error_at: float = 0.0


class Table:
    """The newest status of each (name, hardware id), and each one's last error (thread-safe)."""

    def __init__(self) -> None:
        self.rows: dict[tuple[str, str], Row] = {}
        self.lock = threading.Lock()

    def on_array(self, array) -> None:
        now = time.monotonic()
        with self.lock:
            for status in array.status:
                level = level_of(status)
                key = (status.name, status.hardware_id)
                old = self.rows.get(key)
                row = Row(status.name, status.hardware_id, level, status.message,
                          {kv.key: kv.value for kv in status.values}, now,
                          old.last_error if old else "", old.last_error_at if old else 0.0)
                if level in (1, 2):
                    row.last_error, row.last_error_at = status.message, now
                self.rows[key] = row

    def snapshot(self) -> list[Row]:
        with self.lock:
            return sorted(self.rows.values(), key=lambda r: (r.name, r.hardware_id))


def _number(values: dict[str, str], *keys: str, scale: float = 1.0, digits: int = 1) -> str:
    for key in keys:
        if key in values:
            try:
                return f"{float(values[key]) * scale:.{digits}f}"
            except ValueError:
                return values[key]
    return "-"


def render(rows: list[Row], others: list[str], now: float, width: int) -> str:
    """The table as text, ``width`` columns wide (the last column is cut to fit)."""
    lines = ["  ".join(f"{title:<{w}}" if w else title for title, w in COLUMNS)]
    for row in rows:
        age = now - row.heard_at
        level = "STALE" if age > STALE_S else LEVEL_NAMES.get(row.level, str(row.level))
        error = ""
        if row.last_error:
            error = f"{row.last_error} ({now - row.last_error_at:.0f} s ago)"
        v = row.values
        cells = (row.name.replace(": ", "/", 1), level, v.get("lifecycle state", "-"),
                 _number(v, "tokens/s per request (last 60 s)"), v.get("running", "-"), v.get("waiting", "-"),
                 _number(v, "tau (last 60 s)", digits=2), _number(v, "draft-to-final p50 s (last 60 s)", scale=1000, digits=0),
                 f"{age:.1f}", error)
        lines.append("  ".join(f"{str(c)[:w]:<{w}}" if w else str(c) for c, (_, w) in zip(cells, COLUMNS)))
    for name in others:
        lines.append(f"{name:<28}  {'-':<5}  (publishes no status)")
    return "\n".join(line[:width] for line in lines)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="edge-llm-ros top", description="A live table of the graph's nodes "
                                "(their statuses on /diagnostics), refreshed every second.")
    p.add_argument("--once", action="store_true", help="listen --wait seconds, print one table and exit")
    p.add_argument("--wait", type=float, default=2.0, metavar="S",
                   help="with --once: seconds to listen first (default %(default)s: statuses come every 1 s)")
    p.add_argument("--interval", type=float, default=1.0, metavar="S", help="refresh period (default %(default)s)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.interval <= 0 or args.wait < 0:
        print("edge-llm-ros top: error: --interval must be > 0 and --wait >= 0", file=sys.stderr)
        return 2
    from edge_llm_ros.runtime.cli import Session, wait_forever_or

    table, session = Table(), Session()
    stop = threading.Event()
    try:
        session.node.create_subscription("diagnostic_msgs/msg/DiagnosticArray", "/diagnostics", table.on_array, 100)
        graph = Graph(session, stop, args.interval)  # on a thread: the first look at the graph takes a while
        if args.once:
            wait_forever_or(stop, args.wait)
            rows = table.snapshot()
            print(render(rows, graph.silent(rows), time.monotonic(), 1000))
            return 0 if rows else 1
        tty = sys.stdout.isatty()
        timer = threading.Thread(target=_refresh, args=(table, graph, stop, args.interval, tty), daemon=True)
        timer.start()
        wait_forever_or(stop, None)
        return 0
    finally:
        stop.set()
        session.close()


class Graph:
    """The graph's node names, looked up on a thread every ``interval`` (the embedded backend's first
    answer waits for discovery, about 2 s: the table does not wait for it)."""

    def __init__(self, session, stop: threading.Event, interval: float) -> None:
        self.session, self.stop, self.interval = session, stop, interval
        self.names: list[str] = []
        threading.Thread(target=self._look, daemon=True, name="top-graph").start()

    def _look(self) -> None:
        while not self.stop.is_set():
            try:
                found = self.session.node.get_node_names_and_namespaces()
            except Exception:  # noqa: BLE001 - the session is closing
                return
            self.names = sorted({f"{ns.rstrip('/')}/{name}" for name, ns in found
                                 if not name.startswith("_edge_llm_ros_cli_")})
            self.stop.wait(self.interval)

    def silent(self, rows: list[Row]) -> list[str]:
        """The graph's nodes that published no status."""
        reporting = {r.hardware_id.split(" ")[0] for r in rows} | {r.name.split(":")[0] for r in rows}
        return [fqn for fqn in self.names if fqn not in reporting and fqn.rsplit("/", 1)[-1] not in reporting]


def _refresh(table: Table, graph: Graph, stop: threading.Event, interval: float, tty: bool) -> None:
    while not stop.is_set():
        rows = table.snapshot()
        text = render(rows, graph.silent(rows), time.monotonic(), shutil.get_terminal_size().columns)
        stamp = time.strftime("%H:%M:%S")
        out = f"edge-llm-ros top  {stamp}  {len(rows)} statuses  (Ctrl-C quits)\n{text}\n"
        sys.stdout.write(("\x1b[H\x1b[2J" if tty else "\n") + out)
        sys.stdout.flush()
        stop.wait(interval)
