"""The embedded launcher, run as a real process over fixture nodes and a real Zenoh router.

Fixture nodes (fixtures/fake_node.py) read their command line with params.py,
print what they got, say `ready`, and report every signal they receive. The
router tests run CHAT_NODE instead, a real node on the embedded runtime (Zenoh)
that publishes or prints what it hears. Tests wait on those lines with
deadlines; nothing sleeps a fixed time.
"""

import json
import os
import re
import runpy
import signal
import subprocess
import sys
import threading
import time
import types
from pathlib import Path

import pytest

from edge_llm_ros.runtime.launcher import Launcher, LaunchError, NodeSpec, apply_launch_args, load_plan
from edge_llm_ros.runtime.launcher import main as launcher_main
from edge_llm_ros.runtime.router import free_endpoint, router_reachable

ROOT = Path(__file__).resolve().parents[2]
FAKE_NODE = Path(__file__).parent / "fixtures" / "fake_node.py"
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
STARTED = re.compile(r"^\[launcher\] started (\S+) \(pid (\d+)\)$")

FIXTURE_YAML = """\
/**:
  ros__parameters:
    greeting: hello
fx:
  talker:
    ros__parameters:
      mode: echo
      rate: 1.0
  listener:
    ros__parameters:
      mode: echo
  flaky:
    ros__parameters:
      exit_code: 3
  crasher:
    ros__parameters:
      exit_code: 1
stubborn:
  ros__parameters:
    behavior: stubborn
"""


# -------------------------------------------------------------------- helpers
def node(name, namespace="fx", **extra):
    return {"executable": "fake_node", "name": name, "namespace": namespace,
            "cmd": [sys.executable, str(FAKE_NODE)], **extra}


def deployment(tmp_path: Path, nodes: list[dict], config_text: str = FIXTURE_YAML) -> Path:
    """tmp/launch/fixture.launch.py + tmp/config/fixture.yaml, laid out like the package."""
    (tmp_path / "launch").mkdir(exist_ok=True)
    (tmp_path / "config").mkdir(exist_ok=True)
    (tmp_path / "config" / "fixture.yaml").write_text(config_text)
    launch = tmp_path / "launch" / "fixture.launch.py"
    launch.write_text(f'CONFIG = "fixture.yaml"\nNODES = {nodes!r}\n\n\n'
                      "def generate_launch_description():\n    raise AssertionError('not under ROS 2')\n")
    return launch


class Output:
    """The lines a stream produces, collected by a thread, waited on with deadlines."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.closed = False
        self._cond = threading.Condition()

    def feed(self, text: str) -> None:
        with self._cond:
            self.lines.extend(text.splitlines())
            self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self.closed = True
            self._cond.notify_all()

    def wait_for(self, pattern: str, count: int = 1, timeout: float = 20.0) -> list[re.Match]:
        regex, deadline = re.compile(pattern), time.monotonic() + timeout
        with self._cond:
            while True:
                found = [m for m in map(regex.search, self.lines) if m]
                remaining = deadline - time.monotonic()
                if len(found) >= count:
                    return found
                if remaining <= 0 or self.closed:
                    raise AssertionError(f"wanted {count} line(s) matching {pattern!r}, output was:\n"
                                         + "\n".join(self.lines))
                self._cond.wait(remaining)

    def wait_closed(self, timeout: float = 20.0) -> None:
        with self._cond:
            assert self._cond.wait_for(lambda: self.closed, timeout), "the stream stayed open"

    def count(self, pattern: str) -> int:
        with self._cond:
            return sum(1 for line in self.lines if re.search(pattern, line))


class StreamOutput(Output):
    """A text stream for an in-process Launcher's output."""

    def write(self, text: str) -> int:
        self.feed(text)
        return len(text)

    def flush(self) -> None:
        pass


class TtyOutput(StreamOutput):
    """... that says it is a terminal."""

    def isatty(self) -> bool:
        return True


def start_launcher(procs: list, *args: str) -> tuple[subprocess.Popen, Output]:
    """The launcher as a real process in its own session, stdout+stderr collected line by line.

    After the launcher exits, `out.wait_closed()` before reading its last lines.
    """
    proc = subprocess.Popen([sys.executable, "-m", "edge_llm_ros.runtime.launcher", *map(str, args)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=ENV, cwd=ROOT,
                            start_new_session=True)
    procs.append(proc)
    out = Output()

    def pump() -> None:
        for line in proc.stdout:
            out.feed(line)
        out.close()

    threading.Thread(target=pump, daemon=True).start()
    return proc, out


def started(out: Output) -> dict[str, int]:
    return {m.group(1): int(m.group(2)) for m in map(STARTED.match, out.lines) if m}


def alive(pid: int) -> bool:
    """Running, not a zombie (an orphan reparented to a non-reaping init stays a zombie)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


def wait_until(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


@pytest.fixture
def procs():
    """Launchers started by a test; whatever a failing test leaves behind is killed."""
    launched: list[subprocess.Popen] = []
    yield launched
    for proc in launched:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.fixture(scope="module")
def router():
    """A Zenoh router started outside the launcher, as an already running deployment would have."""
    endpoint = free_endpoint()
    proc = subprocess.Popen([sys.executable, "-m", "edge_llm_ros.runtime.router", "--listen", endpoint],
                            env=ENV, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_until(lambda: router_reachable(endpoint), 15, "the test router")
    yield endpoint
    proc.terminate()
    proc.wait(10)


# ----------------------------------------------------------- running launches
@pytest.mark.slow
def test_launch_starts_router_and_nodes_overrides_params_and_stops_on_ctrl_c(tmp_path, procs):
    launch = deployment(tmp_path, [node("talker", remappings=[("chatter", "/remapped")]),
                                   node("listener"), node("stubborn", namespace="")])
    endpoint = free_endpoint()
    proc, out = start_launcher(procs, launch, "mode:=tree", "rate:=2", "--router", endpoint, "--sigterm-timeout", "1")
    out.wait_for(r"^\[(talker|listener|stubborn)-\d+\] ready$", count=3)
    pids = started(out)
    assert list(pids) == ["zenoh_router", "talker", "listener", "stubborn"]  # the router first
    assert router_reachable(endpoint)

    def said(name: str, pattern: str) -> str:
        return out.wait_for(rf"^\[{name}-{pids[name]}\] {pattern}$")[0].group(1)

    params = {name: json.loads(said(name, "params (.*)")) for name in ("talker", "listener", "stubborn")}
    assert params["talker"] == {"greeting": "hello", "mode": "tree", "rate": 2.0}
    assert type(params["talker"]["rate"]) is float  # `rate:=2` typed like the YAML's 1.0
    assert params["listener"] == {"greeting": "hello", "mode": "tree"}
    assert params["stubborn"] == {"greeting": "hello", "behavior": "stubborn"}  # it has no `mode`
    assert said("stubborn", "identity (.*)") == "/stubborn" and said("talker", "identity (.*)") == "/fx/talker"
    assert said("talker", "chatter -> (.*)") == "/remapped"
    assert said("listener", "chatter -> (.*)") == "/fx/chatter"
    assert {said(name, "router (.*)") for name in ("talker", "listener", "stubborn")} == {endpoint}
    said("listener", "(a line on stderr)")  # stderr is forwarded with the same prefix
    assert not any("\x1b[" in line for line in out.lines)  # no colors when not on a terminal

    os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal does: the whole foreground group
    assert proc.wait(30) == 0
    out.wait_closed()
    out.wait_for(r"^\[launcher\] received SIGINT, shutting down$")
    for name in ("talker", "listener", "stubborn"):  # forwarded once, never double-delivered
        assert out.count(rf"^\[{name}-{pids[name]}\] got SIGINT$") == 1
    out.wait_for(rf"^\[launcher\] stubborn \(pid {pids['stubborn']}\) still running, sending SIGTERM$")
    out.wait_for(rf"^\[stubborn-{pids['stubborn']}\] got SIGTERM$")
    assert not [name for name, pid in pids.items() if alive(pid)]
    assert not router_reachable(endpoint)


@pytest.mark.slow
def test_sigterm_to_the_launcher_stops_every_node_and_exits_zero(tmp_path, procs, router):
    launch = deployment(tmp_path, [node("talker"), node("listener"), node("stubborn", namespace="")])
    proc, out = start_launcher(procs, launch, "--router", router)
    out.wait_for(r"^\[(talker|listener|stubborn)-\d+\] ready$", count=3)
    out.wait_for(rf"^\[launcher\] using the zenoh router at {re.escape(router)}$")
    pids = started(out)
    assert set(pids) == {"talker", "listener", "stubborn"}  # no second router

    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0
    out.wait_closed()
    out.wait_for(r"^\[launcher\] received SIGTERM, shutting down$")
    assert not [name for name, pid in pids.items() if alive(pid)]
    assert router_reachable(router)  # a router the launcher did not start is left alone


@pytest.mark.slow
def test_required_node_dying_stops_the_launch_non_required_is_only_logged(tmp_path, procs, router):
    launch = deployment(tmp_path, [node("server"), node("flaky", required=False), node("crasher")])
    proc, out = start_launcher(procs, launch, "--router", router)
    out.wait_for(r"^\[(server|flaky|crasher)-\d+\] ready$", count=3)
    pids = started(out)

    os.kill(pids["flaky"], signal.SIGUSR1)
    out.wait_for(r"^\[launcher\] process flaky died \(exit code 3\)$")
    assert alive(pids["server"]) and alive(pids["crasher"])

    os.kill(pids["crasher"], signal.SIGUSR1)
    assert proc.wait(30) == 1
    out.wait_closed()
    died = out.lines.index("[launcher] process crasher died (exit code 1)")
    stopped = out.lines.index(f"[server-{pids['server']}] got SIGINT")
    assert died < stopped  # the launcher was still supervising, then shut the rest down
    assert not [name for name, pid in pids.items() if alive(pid)]


@pytest.mark.slow
def test_children_die_with_a_killed_launcher(tmp_path, procs, router):
    launch = deployment(tmp_path, [node("talker"), node("listener"), node("stubborn", namespace="")])
    proc, out = start_launcher(procs, launch, "--router", router)
    out.wait_for(r"^\[(talker|listener|stubborn)-\d+\] ready$", count=3)
    pids = started(out)
    proc.send_signal(signal.SIGKILL)  # no chance to clean up: PR_SET_PDEATHSIG must do it
    proc.wait(10)
    wait_until(lambda: not any(alive(pid) for pid in pids.values()), 15, "orphaned nodes to exit")


@pytest.mark.slow
def test_in_process_launcher_colors_prefixes_on_a_terminal_and_stops_on_request(tmp_path, router):
    plan = load_plan(str(deployment(tmp_path, [node("talker"), node("listener")])))
    apply_launch_args(plan, ["mode:=tree"])
    stream = TtyOutput()
    launcher = Launcher(plan, router=router, stdout=stream, stderr=stream)
    ready, result = threading.Event(), {}
    thread = threading.Thread(target=lambda: result.update(code=launcher.run(ready)))
    thread.start()
    try:
        assert ready.wait(20)
        talker, listener = (m.group(1) for m in stream.wait_for(r"\x1b\[(\d+)m\[(?:talker|listener)-\d+\]"
                                                                 r"\x1b\[0m ready$", count=2))
        assert talker != listener  # one color per node
        assert stream.count(r"^\[launcher\] started talker \(pid \d+\)$") == 1
    finally:
        launcher.stop()
        thread.join(30)
    assert result == {"code": 0}
    assert stream.count(r"got SIGINT$") == 2


@pytest.mark.slow
def test_a_prefix_goes_before_the_node_command(tmp_path, procs, router):
    """launch_ros' ``prefix``: here taskset, so the node runs on one core only."""
    core = min(os.sched_getaffinity(0))
    launch = deployment(tmp_path, [node("talker", prefix=f"taskset -c {core}"), node("listener")])
    proc, out = start_launcher(procs, launch, "--router", router)
    out.wait_for(r"^\[(talker|listener)-\d+\] ready$", count=2)
    pids = started(out)
    assert os.sched_getaffinity(pids["talker"]) == {core}  # taskset exec()s the node: same pid
    assert os.sched_getaffinity(pids["listener"]) == os.sched_getaffinity(0)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0
    bad = deployment(tmp_path, [node("talker", prefix=[1])])
    with pytest.raises(Exception, match="'prefix' is a string or a list of strings"):
        load_plan(str(bad))


@pytest.mark.slow
def test_a_router_that_never_comes_up_fails_the_launch(tmp_path):
    plan = load_plan(str(deployment(tmp_path, [node("talker")])))
    stream = StreamOutput()
    # 192.0.2.1 (TEST-NET-1) is no local address: the router cannot listen there
    launcher = Launcher(plan, router="tcp/192.0.2.1:7447", router_timeout=1.0, sigterm_timeout=0.5,
                        sigkill_timeout=0.5, stdout=stream, stderr=stream)
    assert launcher.run() == 1
    # the router exits at once when it cannot bind; the launcher reports that and starts no node
    stream.wait_for(r"^\[zenoh_router-\d+\] error: cannot start a zenoh router on tcp/192.0.2.1:7447: ")
    stream.wait_for(r"^\[launcher\] process zenoh_router died \(exit code 1\)$")
    assert started(stream).keys() == {"zenoh_router"}  # no node was started
    assert not any(alive(pid) for pid in started(stream).values())


# ---------------------------------------------------- respawn and the router
CHAT_NODE = '''\
"""A node on the embedded runtime: `role` talker publishes std_msgs/String "<pid> <n>" on chatter every
50 ms, listener prints `heard <data>`. With start_on_usr1 it declares its publisher or subscription
only when SIGUSR1 comes (then prints `talking`)."""
import itertools
import os
import signal
import sys

from edge_llm_ros import runtime as rt
from edge_llm_ros.nodes.common import run_node


def build():
    node = rt.Node("chat")
    role = node.declare_parameter("role", "talker").value
    String = rt.message("std_msgs/msg/String")
    count = itertools.count()

    def talk():
        if role == "talker":
            pub = node.create_publisher(String, "chatter", 10)
            node.create_timer(0.05, lambda: pub.publish(String(data=f"{os.getpid()} {next(count)}")))
        else:
            node.create_subscription(String, "chatter", lambda msg: print("heard " + msg.data, flush=True), 10)
        print("talking", flush=True)

    if node.declare_parameter("start_on_usr1", False).value:
        signal.signal(signal.SIGUSR1, lambda *_: node.context.post(talk))
    else:
        talk()
    print("ready", flush=True)
    return node


sys.exit(run_node(build))
'''

CHAT_YAML = """\
fx:
  talker:
    ros__parameters: {role: talker}
  listener:
    ros__parameters: {role: listener}
  late_talker:
    ros__parameters: {role: talker, start_on_usr1: true}
  late_listener:
    ros__parameters: {role: listener, start_on_usr1: true}
"""


def chat_node(tmp_path: Path, name: str, **extra) -> dict:
    """A NODES entry running CHAT_NODE (its role from CHAT_YAML)."""
    script = tmp_path / "chat_node.py"
    script.write_text(CHAT_NODE)
    return {"executable": "chat_node", "name": name, "namespace": "fx", "cmd": [sys.executable, str(script)], **extra}


def start_router(procs: list, endpoint: str) -> subprocess.Popen:
    """A Zenoh router outside the launcher, in its own session (so `procs` cleans it up)."""
    proc = subprocess.Popen([sys.executable, "-m", "edge_llm_ros.runtime.router", "--listen", endpoint],
                            env=ENV, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    procs.append(proc)
    wait_until(lambda: router_reachable(endpoint), 15, f"the router at {endpoint}")
    return proc


def run_in_thread(launcher: Launcher) -> tuple[threading.Thread, dict]:
    """launcher.run() in a thread, once its nodes are running; its exit code lands in the dict."""
    ready, result = threading.Event(), {}
    thread = threading.Thread(target=lambda: result.update(code=launcher.run(ready)))
    thread.start()
    assert ready.wait(30), "the launcher did not start its nodes"
    return thread, result


@pytest.mark.slow
def test_a_killed_respawning_node_comes_back_with_the_same_command(tmp_path, router):
    plan = load_plan(str(deployment(tmp_path, [node("talker", respawn=True, respawn_delay=0.1), node("listener")])))
    apply_launch_args(plan, ["mode:=tree"])
    stream = StreamOutput()
    launcher = Launcher(plan, router=router, stdout=stream, stderr=stream)
    thread, result = run_in_thread(launcher)
    try:
        talker = int(stream.wait_for(r"^\[talker-(\d+)\] ready$")[0].group(1))
        listener = int(stream.wait_for(r"^\[listener-(\d+)\] ready$")[0].group(1))
        for attempt in (1, 2, 3):
            os.kill(talker, signal.SIGKILL)
            stream.wait_for(rf"^\[launcher\] process talker died \(exit code -9\); respawning in 0.1 s "
                            rf"\(attempt {attempt}\)$")
            respawned = int(stream.wait_for(r"^\[launcher\] started talker \(pid (\d+)\)$",
                                            count=attempt + 1)[attempt].group(1))
            assert respawned != talker
            talker = respawned
            stream.wait_for(rf"^\[talker-{talker}\] ready$")
            params = json.loads(stream.wait_for(rf"^\[talker-{talker}\] params (.*)$")[0].group(1))
            assert params == {"greeting": "hello", "mode": "tree", "rate": 1.0}  # the same command, overrides too
        assert thread.is_alive() and alive(talker) and alive(listener)
        assert stream.count(r"^\[launcher\] started listener ") == 1
        assert len(launcher._children) == 2  # each respawn replaced the dead process
    finally:
        launcher.stop()
        thread.join(30)
    assert result == {"code": 0}
    assert not alive(talker) and not alive(listener)


@pytest.mark.slow
def test_respawn_max_retries_then_the_exit_counts_as_usual(tmp_path, procs, router):
    launch = deployment(tmp_path, [node("server", respawn=True),
                                   node("flaky", required=False, respawn=True, respawn_max_retries=1),
                                   node("crasher", respawn=True, respawn_max_retries=2)])
    proc, out = start_launcher(procs, launch, "--router", router)
    out.wait_for(r"^\[(server|flaky|crasher)-\d+\] ready$", count=3)
    server = started(out)["server"]

    def crash(name: str, times: int) -> None:
        """SIGUSR1 (exit with its exit_code) to the newest process of `name`, `times` times."""
        for n in range(1, times + 1):
            pid = int(out.wait_for(rf"^\[launcher\] started {name} \(pid (\d+)\)$", count=n)[n - 1].group(1))
            out.wait_for(rf"^\[{name}-{pid}\] ready$")
            os.kill(pid, signal.SIGUSR1)
            out.wait_for(rf"^\[launcher\] process {name} died \(exit code \d\)", count=n)

    crash("flaky", 2)  # one respawn, then a non-required exit: only logged
    out.wait_for(r"^\[launcher\] process flaky died \(exit code 3\); respawning in 0 s \(attempt 1\)$")
    out.wait_for(r"^\[launcher\] process flaky died \(exit code 3\)$")
    assert proc.poll() is None and alive(server)

    crash("crasher", 3)  # two respawns, then a required exit: the launch stops
    assert proc.wait(30) == 1
    out.wait_closed()
    assert out.count(r"^\[launcher\] process crasher died \(exit code 1\); respawning in 0 s \(attempt [12]\)$") == 2
    assert out.count(r"^\[launcher\] started (flaky|crasher) ") == 5
    # the shutdown that followed respawned nothing: server got SIGINT and exited, once
    assert out.count(rf"^\[server-{server}\] got SIGINT$") == 1
    assert out.count(r"^\[launcher\] started server ") == 1
    assert not any(alive(pid) for pid in started(out).values())


@pytest.mark.slow
def test_a_stop_cancels_a_pending_respawn(tmp_path, procs, router):
    launch = deployment(tmp_path, [node("talker", respawn=True, respawn_delay=30.0)])
    proc, out = start_launcher(procs, launch, "--router", router)
    talker = int(out.wait_for(r"^\[talker-(\d+)\] ready$")[0].group(1))
    os.kill(talker, signal.SIGKILL)
    out.wait_for(r"^\[launcher\] process talker died \(exit code -9\); respawning in 30 s \(attempt 1\)$")
    assert proc.poll() is None  # its only node is dead, but coming back: not "no nodes left"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(15) == 0  # well before the 30 s
    out.wait_closed()
    out.wait_for(r"^\[launcher\] received SIGTERM, shutting down$")
    assert out.count(r"^\[launcher\] started talker ") == 1


@pytest.mark.slow
def test_a_killed_router_is_replaced_and_nodes_started_before_and_after_it_talk(tmp_path, procs):
    """The nodes' Zenoh sessions reconnect to the new router: a subscriber started after the restart
    hears a publisher started before it, and two nodes started before it that declare their publisher
    and subscription only after it find each other."""
    launch = deployment(tmp_path, [chat_node(tmp_path, "talker"), chat_node(tmp_path, "listener", respawn=True),
                                   chat_node(tmp_path, "late_talker"), chat_node(tmp_path, "late_listener")],
                        CHAT_YAML)
    endpoint = free_endpoint()
    proc, out = start_launcher(procs, launch, "--router", endpoint)
    out.wait_for(r"^\[(talker|listener|late_talker|late_listener)-\d+\] ready$", count=4)
    pids = started(out)
    out.wait_for(rf"^\[listener-{pids['listener']}\] heard {pids['talker']} \d+$")

    os.kill(pids["zenoh_router"], signal.SIGKILL)
    out.wait_for(r"^\[launcher\] process zenoh_router died \(exit code -9\)$")
    out.wait_for(rf"^\[launcher\] zenoh router at {re.escape(endpoint)} is gone; starting a new one$")
    out.wait_for(rf"^\[launcher\] zenoh router ready at {re.escape(endpoint)}$", count=2)
    router = int(out.wait_for(r"^\[launcher\] started zenoh_router \(pid (\d+)\)$", count=2)[1].group(1))
    assert router != pids["zenoh_router"] and alive(router)

    os.kill(pids["listener"], signal.SIGKILL)  # comes back as a subscriber started after the restart
    listener = int(out.wait_for(r"^\[launcher\] started listener \(pid (\d+)\)$", count=2)[1].group(1))
    out.wait_for(rf"^\[listener-{listener}\] heard {pids['talker']} \d+$")

    os.kill(pids["late_talker"], signal.SIGUSR1)
    os.kill(pids["late_listener"], signal.SIGUSR1)
    out.wait_for(rf"^\[late_listener-{pids['late_listener']}\] heard {pids['late_talker']} \d+$")

    assert proc.poll() is None
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0
    out.wait_closed()
    assert not router_reachable(endpoint)  # the router it started went last
    assert not any(alive(pid) for pid in [*pids.values(), router, listener])


@pytest.mark.slow
def test_a_router_found_running_that_dies_is_replaced_by_the_launchers_own(tmp_path, procs):
    endpoint = free_endpoint()
    external = start_router(procs, endpoint)
    launch = deployment(tmp_path, [node("talker"), node("listener")])
    proc, out = start_launcher(procs, launch, "--router", endpoint)
    out.wait_for(r"^\[(talker|listener)-\d+\] ready$", count=2)
    out.wait_for(rf"^\[launcher\] using the zenoh router at {re.escape(endpoint)}$")

    external.kill()
    external.wait(10)
    out.wait_for(rf"^\[launcher\] zenoh router at {re.escape(endpoint)} is gone; starting a new one$")
    out.wait_for(rf"^\[launcher\] zenoh router ready at {re.escape(endpoint)}$")
    assert router_reachable(endpoint) and proc.poll() is None
    router = started(out)["zenoh_router"]

    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0
    assert not alive(router) and not router_reachable(endpoint)


@pytest.mark.slow
def test_a_router_that_cannot_be_replaced_stops_the_launch(tmp_path, procs):
    endpoint = free_endpoint()
    external = start_router(procs, endpoint)
    plan = load_plan(str(deployment(tmp_path, [node("talker"), node("listener", required=False)])))
    stream = StreamOutput()
    # no router process answers within 50 ms of its start: the replacement fails
    launcher = Launcher(plan, router=endpoint, router_timeout=0.05, sigterm_timeout=1.0, sigkill_timeout=1.0,
                        stdout=stream, stderr=stream)
    thread, result = run_in_thread(launcher)
    nodes = started(stream)
    external.kill()
    thread.join(30)
    assert result == {"code": 1}
    stream.wait_for(rf"^\[launcher\] zenoh router at {re.escape(endpoint)} is gone; starting a new one$")
    stream.wait_for(rf"^\[launcher\] the zenoh router did not accept connections at {re.escape(endpoint)} "
                    r"within 0.05 s$")
    stream.wait_for(rf"^\[launcher\] no zenoh router at {re.escape(endpoint)} and a new one did not come up; "
                    r"the nodes cannot reach each other, stopping the deployment$")
    assert not any(alive(pid) for pid in started(stream).values())
    assert all(stream.count(rf"^\[{name}-{pid}\] got SIGINT$") == 1 for name, pid in nodes.items())


# ------------------------------------------------------------------- planning
def test_params_yaml_target_uses_the_launch_file_that_names_it(tmp_path):
    launch = deployment(tmp_path, [node("talker"), node("stubborn", namespace="", required=False)])
    plan = load_plan(str(tmp_path / "config" / "fixture.yaml"))
    assert [(n.fqn, n.required, n.cmd) for n in plan.nodes] == [
        ("/fx/talker", True, [sys.executable, str(FAKE_NODE)]),
        ("/stubborn", False, [sys.executable, str(FAKE_NODE)])]
    assert plan.params_file == (tmp_path / "config" / "fixture.yaml").resolve()
    assert load_plan(str(launch)).params_file == plan.params_file


def test_params_yaml_alone_runs_one_node_per_entry(tmp_path):
    solo = tmp_path / "config" / "solo.yaml"
    solo.parent.mkdir()
    solo.write_text("/**:\n  ros__parameters: {verbose: false}\n"
                    "edge_llm:\n  echo_node:\n    ros__parameters: {mode: echo, response_delay_s: 0.0}\n"
                    "monitor_node:\n  ros__parameters: {pub_rate: 1.0}\n")
    plan = load_plan(str(solo))
    apply_launch_args(plan, ["mode:=tree", "response_delay_s:=1", "verbose:=true"])
    echo, monitor = plan.nodes
    assert echo.command(plan.params_files) == [
        sys.executable, "-m", "edge_llm_ros.nodes.echo_node", "--ros-args", "-r", "__node:=echo_node",
        "-r", "__ns:=/edge_llm", "--params-file", str(solo.resolve()),
        "-p", "mode:=tree", "-p", "response_delay_s:=1.0", "-p", "verbose:=true"]
    assert monitor.command(plan.params_files)[2:] == [
        "edge_llm_ros.nodes.monitor_node", "--ros-args", "-r", "__node:=monitor_node",
        "--params-file", str(solo.resolve()), "-p", "verbose:=true"]


def test_the_shipped_pipeline_argument_reaches_the_serve_node():
    plan = load_plan("pipeline")
    assert plan.params_file == ROOT / "config" / "pipeline.yaml"
    apply_launch_args(plan, ["max_requests:=3", "threads:=1"])
    planner, serve, monitor = plan.nodes
    assert (planner.fqn, serve.fqn, monitor.fqn) == ("/edge_llm/planner_node", "/edge_llm/serve_node", "/edge_llm/monitor")
    assert serve.parameters == {"max_requests": "3", "threads": "1"} and planner.parameters == {"threads": "1"}
    assert monitor.parameters == {}
    assert serve.command(plan.params_files)[3:] == [
        "--ros-args", "-r", "__node:=serve_node", "-r", "__ns:=/edge_llm", "--params-file",
        str(ROOT / "config" / "pipeline.yaml"), "-p", "max_requests:=3", "-p", "threads:=1"]


@pytest.mark.parametrize("deployment, servers", [
    ("robot", []), ("edge_cloud", ["/edge_llm/verifier_node"]),
    ("pipeline", ["/edge_llm/stage_0", "/edge_llm/stage_1"])])
def test_go2_sim_starts_the_servers_its_deployment_needs(deployment, servers):
    plan = load_plan("go2_sim")
    apply_launch_args(plan, [f"deployment:={deployment}", "mode:=ar"])
    names = [spec.fqn for spec in plan.nodes]
    assert names == ["/sim", "/edge_llm/go2_bridge", "/edge_llm/navigator", *servers]
    navigator = next(spec for spec in plan.nodes if spec.fqn == "/edge_llm/navigator")
    assert navigator.parameters["deployment"] == deployment
    for i, stage in enumerate(spec for spec in plan.nodes if "stage_" in spec.fqn):
        command = stage.command(plan.params_files)
        assert "edge_llm_ros.nodes.stage_node" in command and f"__node:=stage_{i}" in command


def test_foxglove_adds_a_bridge_to_any_launch_and_rviz_is_an_argument_where_the_file_names_a_config():
    plan = load_plan("go2_sim")
    apply_launch_args(plan, ["foxglove:=true", "foxglove_port:=9001", "rviz:=true", "deployment:=edge_cloud"])
    assert [spec.fqn for spec in plan.nodes][-2:] == ["/edge_llm/verifier_node", "/edge_llm/foxglove_bridge"]
    bridge = plan.nodes[-1]
    assert bridge.parameters == {"port": "9001"} and not bridge.required
    assert "edge_llm_ros.nodes.foxglove_bridge_node" in bridge.command(plan.params_files)
    assert plan.rviz == "go2_sim.rviz" and plan.rviz_asked
    plain = load_plan("pipeline")
    apply_launch_args(plain, [])
    assert "/edge_llm/foxglove_bridge" not in [spec.fqn for spec in plain.nodes]
    for arguments, message in ((["rviz:=true"], "unknown launch argument 'rviz'"),  # pipeline names no rviz config
                               (["foxglove:=maybe"], "launch argument foxglove:=maybe: must be true or false"),
                               (["foxglove_port:=70000"], "foxglove_port:=70000: must be a port number in [0, 65535]")):
        with pytest.raises(LaunchError, match=re.escape(message)):
            apply_launch_args(load_plan("pipeline"), arguments)


def test_show_args_lists_every_overridable_parameter(tmp_path, capsys):
    launch = deployment(tmp_path, [node("talker"), node("listener"), node("stubborn", namespace="")])
    assert launcher_main([str(launch), "--show-args"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "foxglove:=false    true: a foxglove_bridge_node (Foxglove's WebSocket protocol) on foxglove_port",
        "foxglove_port:=8765",
        "keystore:=    a keystore (edge-llm-ros security create): mutual TLS, the policy's access control, "
        "an enclave per node",
        "behavior:=stubborn    nodes: /stubborn",
        "greeting:=hello    nodes: /fx/talker, /fx/listener, /stubborn",
        "mode:=echo    nodes: /fx/talker, /fx/listener",
        "rate:=1.0    nodes: /fx/talker"]


# --------------------------------------------------------------------- errors
BAD_LAUNCH = "NODES = [{'executable': 'x'}\n"  # unclosed bracket
BROKEN_CONFIG_LAUNCH = "CONFIG = 'broken.yaml'\nNODES = [{'executable': 'x'}]\n"
BAD_NAME_LAUNCH = "NODES = [{'executable': 'x', 'name': 'bad-name'}]\n"


@pytest.mark.parametrize("args, message", [
    (["{launch}", "bogus:=1"], "unknown launch argument 'bogus': no node has that parameter in {config}"),
    (["{launch}", "rate:=fast"], "launch argument rate:=fast is a str, but 'rate' is a float in {config}"),
    (["{launch}", "oops"], "launch arguments look like name:=value, got 'oops'"),
    (["no_such_launch"], "no launch file 'no_such_launch.launch.py' (looked in"),
    (["{tmp}/missing.yaml"], "{tmp}/missing.yaml: no such parameters file"),
    (["{tmp}/missing.launch.py"], "{tmp}/missing.launch.py: no such launch file"),
    (["{tmp}/bad.yaml"], "{tmp}/bad.yaml: malformed YAML (line 2, column 10: mapping values"),
    (["{tmp}/bad.launch.py"], "{tmp}/bad.launch.py: cannot load launch file (SyntaxError:"),
    (["{tmp}/launch/broken_config.launch.py"],
     "{tmp}/config/broken.yaml: node entry 'talker/mode' has no ros__parameters"),
    (["{tmp}/launch/bad_name.launch.py"], "bad_name.launch.py: invalid node name or namespace ''/'bad-name'"),
    (["{tmp}/ghost.yaml"], "no executable 'ghost' for node /ghost (module edge_llm_ros.nodes.ghost not found)"),
    (["{launch}", "--router", "udp/1.2.3.4"], "router endpoint must look like tcp/HOST:PORT"),
])
@pytest.mark.slow
def test_bad_input_is_one_line_on_stderr_and_exit_code_2(tmp_path, args, message):
    (tmp_path / "pkg").mkdir()
    launch = deployment(tmp_path / "pkg", [node("talker")])
    config = tmp_path / "pkg" / "config" / "fixture.yaml"
    (tmp_path / "bad.yaml").write_text("talker:\n  mode: a: b\n")
    (tmp_path / "bad.launch.py").write_text(BAD_LAUNCH)
    for folder in ("config", "launch"):
        (tmp_path / folder).mkdir()
    (tmp_path / "config" / "broken.yaml").write_text("talker:\n  mode: echo\n")
    (tmp_path / "launch" / "broken_config.launch.py").write_text(BROKEN_CONFIG_LAUNCH)
    (tmp_path / "launch" / "bad_name.launch.py").write_text(BAD_NAME_LAUNCH)
    (tmp_path / "ghost.yaml").write_text("ghost:\n  ros__parameters: {a: 1}\n")
    argv = [a.format(launch=launch, tmp=tmp_path) for a in args]
    result = subprocess.run([sys.executable, "-m", "edge_llm_ros.runtime.launcher", *argv], capture_output=True,
                            text=True, env=ENV, cwd=ROOT, timeout=60)
    assert result.returncode == 2
    assert result.stdout == ""
    assert len(result.stderr.splitlines()) == 1, result.stderr
    assert message.format(config=config, tmp=tmp_path) in result.stderr


@pytest.mark.parametrize("extra, message", [
    ({"respawn": "yes"}, "node talker: 'respawn' is True or False, got 'yes'"),
    ({"lifecycle": 1}, "node talker: 'lifecycle' is True or False, got 1"),
    ({"respawn": True, "respawn_delay": -1}, "node talker: 'respawn_delay' is seconds >= 0, got -1"),
    ({"respawn": True, "respawn_delay": "2"}, "node talker: 'respawn_delay' is seconds >= 0, got '2'"),
    ({"respawn": True, "respawn_delay": float("nan")}, "'respawn_delay' is seconds >= 0, got nan"),
    ({"respawn": True, "respawn_max_retries": 1.5}, "'respawn_max_retries' is an int (-1: no limit), got 1.5"),
    ({"respawn": True, "respawn_max_retries": True}, "'respawn_max_retries' is an int (-1: no limit), got True"),
])
def test_bad_respawn_settings_are_named(tmp_path, extra, message):
    with pytest.raises(LaunchError) as error:
        NodeSpec.from_entry(node("talker", **extra), tmp_path / "fixture.launch.py")
    assert message in str(error.value)


def test_respawn_settings_default_as_in_launch(tmp_path):
    plan = load_plan(str(deployment(tmp_path, [node("talker"), node("listener", respawn=True, respawn_delay=2,
                                                                    respawn_max_retries=3)])))
    talker, listener = plan.nodes
    assert (talker.respawn, talker.respawn_delay, talker.respawn_max_retries) == (False, 0.0, -1)
    assert (listener.respawn, listener.respawn_delay, listener.respawn_max_retries) == (True, 2.0, 3)
    assert type(listener.respawn_delay) is float
    assert [listener.may_respawn(n) for n in range(5)] == [True, True, True, False, False]
    assert not talker.may_respawn(0)


# ------------------------------------------------------------- under ROS 2
class _Recorded:
    def __init__(self, *args, **kwargs):
        self.args, self.kwargs = args, kwargs


def _fake_ros_launch(monkeypatch, share: Path | None = None) -> None:
    """Stand-ins for launch / launch_ros that record how launch_support calls their documented API."""
    mods = {name: types.ModuleType(name) for name in (
        "launch", "launch.actions", "launch.conditions", "launch.substitutions", "launch.event_handlers", "launch.events",
        "launch_ros",
        "launch_ros.actions", "launch_ros.event_handlers", "launch_ros.events", "launch_ros.events.lifecycle",
        "lifecycle_msgs", "lifecycle_msgs.msg")}
    for module, names in (("launch", ["LaunchDescription"]),
                          ("launch.actions", ["DeclareLaunchArgument", "Shutdown", "EmitEvent", "RegisterEventHandler",
                                              "ExecuteProcess", "LogInfo", "OpaqueFunction", "SetEnvironmentVariable"]),
                          ("launch.substitutions", ["LaunchConfiguration", "PythonExpression"]), ("launch.event_handlers", ["OnProcessStart"]),
                          ("launch.conditions", ["IfCondition"]),
                          ("launch_ros.actions", ["Node", "LifecycleNode"]),
                          ("launch_ros.event_handlers", ["OnStateTransition"]),
                          ("launch_ros.events.lifecycle", ["ChangeState"])):
        for name in names:
            setattr(mods[module], name, type(name, (_Recorded,), {}))
    mods["launch.events"].matches_action = lambda action: ("matches", action)
    mods["lifecycle_msgs.msg"].Transition = types.SimpleNamespace(TRANSITION_CONFIGURE=1, TRANSITION_ACTIVATE=3)
    if share is not None:
        mods["ament_index_python"] = types.ModuleType("ament_index_python")
        mods["ament_index_python.packages"] = types.ModuleType("ament_index_python.packages")
        mods["ament_index_python.packages"].get_package_share_directory = lambda pkg: str(share / pkg)
    for name, module in mods.items():
        monkeypatch.setitem(sys.modules, name, module)


def test_ros2_launch_description_of_the_pipeline(monkeypatch, tmp_path):
    share = tmp_path / "share"
    (share / "edge_llm_ros" / "config").mkdir(parents=True)
    installed = share / "edge_llm_ros" / "config" / "pipeline.yaml"
    installed.write_text((ROOT / "config" / "pipeline.yaml").read_text())
    _fake_ros_launch(monkeypatch, share)
    description = runpy.run_path(str(ROOT / "launch" / "pipeline.launch.py"))["generate_launch_description"]()
    actions = description.args[0]
    declared = {a.args[0]: a.kwargs["default_value"] for a in actions if type(a).__name__ == "DeclareLaunchArgument"}
    assert {"max_requests": "16", "model": "''", "plan_file": "''", "threads": "0", "calibrate": "auto",
            "stats_period_s": "1.0", "context": "2048"}.items() <= declared.items()
    assert {"foxglove": "false", "foxglove_port": "8765", "keystore": ""}.items() <= declared.items()
    secured = [a for a in actions if type(a).__name__ == "SetEnvironmentVariable"]  # keystore:= sets SROS2's
    assert [a.args[0] for a in secured] == ["ROS_SECURITY_KEYSTORE", "ROS_SECURITY_ENABLE", "ROS_SECURITY_STRATEGY"]
    assert all(type(a.kwargs["condition"]).__name__ == "IfCondition" for a in secured)
    *nodes, bridge = [a.kwargs for a in actions if type(a).__name__ in ("Node", "LifecycleNode")]
    assert [type(a).__name__ for a in actions if type(a).__name__ in ("Node", "LifecycleNode")] == [
        "LifecycleNode", "LifecycleNode", "Node", "Node"]  # planner_node and serve_node are managed
    assert [n["ros_arguments"] for n in nodes] == [["--enclave", f"/edge_llm/{name}"]  # each its own enclave
                                                   for name in ("planner_node", "serve_node", "monitor")]
    assert [(n["package"], n["executable"], n["name"], n["namespace"], n["output"]) for n in nodes] == [
        ("edge_llm_ros", "planner_node", "planner_node", "edge_llm", "screen"),
        ("edge_llm_ros", "serve_node", "serve_node", "edge_llm", "screen"),
        ("edge_llm_ros", "monitor_node", "monitor", "edge_llm", "screen")]
    # foxglove:=true starts the bridge beside them, on foxglove_port
    assert (bridge["executable"], bridge["name"], bridge["namespace"]) == ("foxglove_bridge_node", "foxglove_bridge",
                                                                         "edge_llm")
    assert bridge["condition"].args[0].args[0] == "foxglove" and bridge["parameters"][0]["port"].args[0] == "foxglove_port"
    serve_file, serve_overrides, managed = nodes[1]["parameters"]
    assert serve_file == str(installed) and managed == {"autostart": False}  # the launch drives its transitions
    assert nodes[0]["parameters"][2] == {"autostart": False}
    managed_nodes = [a for a in actions if type(a).__name__ == "LifecycleNode"]
    handlers = [a.args[0] for a in actions if type(a).__name__ == "RegisterEventHandler"]
    assert len(handlers) == 4  # each managed node: configure when its process starts, activate when configured
    for node, (on_start, on_configured) in zip(managed_nodes, (handlers[:2], handlers[2:])):
        assert type(on_start).__name__ == "OnProcessStart" and on_start.kwargs["target_action"] is node
        (configure,) = on_start.kwargs["on_start"]
        assert configure.kwargs["event"].kwargs == {"lifecycle_node_matcher": ("matches", node), "transition_id": 1}
        assert on_configured.kwargs["target_lifecycle_node"] is node
        assert (on_configured.kwargs["start_state"], on_configured.kwargs["goal_state"]) == ("configuring", "inactive")
        (activate,) = on_configured.kwargs["entities"]
        assert activate.kwargs["event"].kwargs["transition_id"] == 3
    assert {k: (v.args[0], v.kwargs["default"]) for k, v in serve_overrides.items()}["max_requests"] == (
        "max_requests", "16")
    assert list(nodes[2]["parameters"][1]) == ["pub_rate"]
    running, stopping = types.SimpleNamespace(is_shutdown=False), types.SimpleNamespace(is_shutdown=True)
    assert all(type(n["on_exit"](None, running)[0]).__name__ == "Shutdown" for n in nodes)  # all required
    assert all(n["on_exit"](None, stopping) is None for n in nodes)  # no second Shutdown while shutting down


def test_ros2_launch_description_with_per_node_values(monkeypatch, tmp_path):
    from edge_llm_ros import launch_support

    _fake_ros_launch(monkeypatch)
    monkeypatch.setattr(launch_support, "config_path", lambda config: tmp_path / config)
    (tmp_path / "two.yaml").write_text("a:\n  ros__parameters: {mode: x, k: 1}\nb:\n  ros__parameters: {mode: y}\n")
    description = launch_support.describe([{"executable": "e", "name": "a"},
                                           {"executable": "e", "name": "b", "required": False,
                                            "remappings": [("in", "/out")], "prefix": "taskset -c 1"}],
                                          "two.yaml")
    actions = description.args[0]
    assert [a.args[0] for a in actions if type(a).__name__ == "DeclareLaunchArgument"] == [
        "k", "keystore", "foxglove", "foxglove_port"]  # mode differs; every launch has keystore:=, foxglove:=, foxglove_port:=
    a, b, _bridge = (x.kwargs for x in actions if type(x).__name__ == "Node")
    assert a["parameters"][1]["mode"].kwargs["default"] == "x" and b["parameters"][1]["mode"].kwargs["default"] == "y"
    assert "on_exit" in a and "on_exit" not in b
    assert b["remappings"] == [("in", "/out")] and b["namespace"] is None
    assert b["prefix"] == "taskset -c 1" and "prefix" not in a


def test_ros2_launch_description_passes_respawn_settings(monkeypatch, tmp_path):
    """launch emits ProcessExited on every exit, respawned or not: a required node's Shutdown waits for the last."""
    from edge_llm_ros import launch_support

    _fake_ros_launch(monkeypatch)
    monkeypatch.setattr(launch_support, "config_path", lambda config: tmp_path / config)
    (tmp_path / "r.yaml").write_text("a:\n  ros__parameters: {k: 1}\n")
    description = launch_support.describe([
        {"executable": "e", "name": "a", "respawn": True, "respawn_delay": 2.0, "respawn_max_retries": 2},
        {"executable": "e", "name": "b", "required": False, "respawn": True},
        {"executable": "e", "name": "c", "respawn": True},
        {"executable": "e", "name": "d"}], "r.yaml")
    a, b, c, d, _bridge = (x.kwargs for x in description.args[0] if type(x).__name__ == "Node")
    assert (a["respawn"], a["respawn_delay"], a["respawn_max_retries"]) == (True, 2.0, 2)
    assert (b["respawn"], b["respawn_delay"], b["respawn_max_retries"]) == (True, 0.0, -1)
    assert not any(key.startswith("respawn") for key in d)  # only when set
    running = types.SimpleNamespace(is_shutdown=False)
    shutdowns = [a["on_exit"](None, running) for _ in range(3)]  # exits 1 and 2 are respawned, 3 is the last
    assert shutdowns[:2] == [None, None] and type(shutdowns[2][0]).__name__ == "Shutdown"
    assert "on_exit" not in b and "on_exit" not in c  # c: required, but respawned for ever
    assert type(d["on_exit"](None, running)[0]).__name__ == "Shutdown"


def test_ros2_launch_description_of_edge_cloud_respawns_both_peers(monkeypatch):
    _fake_ros_launch(monkeypatch)
    description = runpy.run_path(str(ROOT / "launch" / "edge_cloud.launch.py"))["generate_launch_description"]()
    nodes = {n.kwargs["name"]: n.kwargs for n in description.args[0] if type(n).__name__ == "LifecycleNode"}
    assert {name: (n["respawn"], n["respawn_delay"], "on_exit" in n) for name, n in nodes.items()} == {
        "verifier_node": (True, 1.0, False), "draft_node": (True, 1.0, False)}
    # configured on every process start (a respawn too), activated after each configure
    assert sum(type(a).__name__ == "RegisterEventHandler" for a in description.args[0]) == 4
