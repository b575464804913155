"""What every node's main() does: init, build, spin, shut down cleanly."""

from __future__ import annotations

import contextlib
import functools
import gc
import os
import signal
import sys
import threading
import time
from typing import Callable

from edge_llm_ros import runtime as rt

MALLOC_ARENAS = 2


def limit_malloc_arenas(count: int = MALLOC_ARENAS) -> bool:
    """Cap glibc's malloc arenas (M_ARENA_MAX) for this process; False where that is not glibc.

    glibc gives each thread that allocates an arena of its own (up to 8 per core) and hands little
    of their free memory back, so a node whose work runs on many threads (one per goal or
    instruction, Zenoh's receive threads) grows its RSS with every burst of traffic. Measured under
    fuzzing (tools/reliability.py): draft_node 449 -> 1082 MB over three bursts with the default,
    448 -> 630 MB and flat after the first burst with 2 arenas. Python threads mostly wait for the
    GIL, so two arenas cost no parallelism. Call it before threads start (arenas made earlier stay).
    """
    libc = _libc()
    if libc is None or not hasattr(libc, "mallopt"):  # musl and others have no mallopt
        return False
    return bool(libc.mallopt(-8, count))  # M_ARENA_MAX, from glibc's malloc.h


TRIM_PERIOD_ENV = "EDGE_LLM_TRIM_PERIOD_S"  # the reliability bench shortens it to read settled RSS sooner


def trim_period_s() -> float:
    """Seconds between two heap trims: 10, or ``$EDGE_LLM_TRIM_PERIOD_S`` (0.5..3600)."""
    raw = os.environ.get(TRIM_PERIOD_ENV, "")
    try:
        value = float(raw) if raw else 10.0
    except ValueError:
        value = 10.0
    return min(max(value, 0.5), 3600.0)


@functools.cache
def _libc():
    """This process's C library (its own symbols, as the launcher's prctl uses), once; None off Linux."""
    import ctypes

    return ctypes.CDLL(None) if sys.platform.startswith("linux") else None


def start_malloc_trimmer(period_s: float | None = None) -> threading.Thread | None:
    """A daemon thread that hands the heap's free pages back to the OS every ``period_s`` (default
    :func:`trim_period_s`)
    (glibc's malloc_trim: the memory a burst of traffic used and freed, kept by the allocator
    otherwise); None where that is not glibc. The call releases the GIL (ctypes) and takes a few
    milliseconds on a node's heap."""
    if not trim_heap():
        return None
    period_s = trim_period_s() if period_s is None else period_s

    def trim() -> None:
        while True:
            time.sleep(period_s)
            trim_heap()

    thread = threading.Thread(target=trim, daemon=True, name="malloc-trim")
    thread.start()
    return thread


def trim_heap() -> bool:
    """Hand the heap's free pages back to the OS now (glibc's malloc_trim); False where that is not glibc."""
    libc = _libc()
    if libc is None or not hasattr(libc, "malloc_trim"):
        return False
    libc.malloc_trim(0)
    return True


class SelfStarting:
    """A node that :func:`run_node` brings up itself once it is built, when its ``autostart`` is true
    (nodes/managed.ManagedNode: its `autostart` parameter)."""

    autostart: bool = False

    def bring_up(self) -> None:
        """Take the node to where it serves; ValueError saying why it cannot."""
        raise NotImplementedError


def run_node(build: Callable[[], object], args: list[str] | None = None) -> int:
    """rclpy's usual main: init, make the node, spin until Ctrl-C / SIGTERM, clean up.

    A bad parameter or params file, or a managed node with `autostart` whose configure fails
    (nodes/managed.py), ends the process with a one-line error and exit code 2, as a CLI would.
    The start-up (building the node, and autostart's configure: loading a model, calibrating) is
    stoppable: SIGINT or SIGTERM ends it at once, exit code 0 (runtime/stopping.py).
    Malloc arenas are capped first (limit_malloc_arenas).
    """
    limit_malloc_arenas()
    start_malloc_trimmer()
    node = None
    try:
        rt.init(args=args)
        node = rt.stoppable(build)
        node.get_logger().info(f"runtime: {rt.BACKEND} ({rt.WHY})")
        if isinstance(node, SelfStarting) and node.autostart:  # a managed node (nodes/managed.py)
            rt.stoppable(node.bring_up)
    except rt.Stopped:  # a shutdown signal while starting: stop as after spin
        return _stop(node, 0)
    except (ValueError, OSError) as exc:  # ParamsError, ParameterError, InterfaceError are ValueErrors
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return _stop(node, 2)
    try:
        rt.spin(node)
    except KeyboardInterrupt:  # Stopped too: a signal ended a callback's stoppable call
        pass
    finally:
        _stop(node, 0)
    return 0


def _stop(node, code: int) -> int:
    """Destroy ``node`` (None: not built), shut the runtime down; ``code``.

    Then gc.freeze(): the interpreter's exit collects every object it still holds, and with torch
    and transformers imported that alone took 2.4-2.9 s here (a process importing
    transformers' Llama and exiting at once), past the 2 s a service manager's SIGTERM gives a
    node; with the heap frozen, 0.2-0.4 s. The OS frees the process's memory either way."""
    try:
        if node is not None:
            node.destroy_node()
    finally:
        rt.shutdown()
        ignore_interrupts()
        gc.freeze()
    return code


def ignore_interrupts() -> None:
    """Ignore SIGINT from here on, in the main thread. The interpreter's exit restores the default
    handler (unless it is SIG_IGN), and a process with torch and llama.cpp loaded takes a moment to
    exit: a second Ctrl-C in that moment (a terminal signals the whole process group, then `ros2
    launch` signals each node again) would kill it with status -2 after a clean shutdown."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)


def policy_clock(node) -> Callable[[], float]:
    """Seconds on the clock a node's timing rules run on: time.monotonic, or with `use_sim_time` the
    node's ROS time (/clock), so that a bag replayed with `bag play --clock`, at any rate, is timed as
    it was recorded (a frame's age, a motion's length, a watchdog)."""
    if node.get_parameter("use_sim_time").value:
        clock = node.get_clock()
        return lambda: clock.now().nanoseconds / 1e9
    return time.monotonic


def stamp(node, msg):
    """``msg`` with ``header.stamp`` set to now on ``node``'s clock (rclpy's node clock, or the embedded
    backend's); every message with a header is published through it."""
    msg.header.stamp = node.get_clock().now().to_msg()
    return msg


MATCH_WAIT_S = 2.0  # how long MatchGate.wait gives DDS to match a subscription the graph already shows
MATCH_POLL_S = 0.01


class MatchGate:
    """Holds a message back until ``publisher`` reaches every subscription of its topic that the graph
    shows, for at most ``wait_s``. Under DDS a new subscription appears in the graph (ros_discovery_info)
    before the writer has matched it (SEDP), and a volatile writer does not deliver what it sent before:
    a verifier that has just (re)started would lose a robot's first draft, and the robot would wait its
    whole timeout_s for the answer. On the embedded backend both counts come from the same graph, so
    it never waits. A subscription that stays unmatched (one whose QoS the writer cannot offer) costs
    ``wait_s`` once, with a warning; the gate waits again only when the count of subscriptions changes."""

    def __init__(self, node, publisher, wait_s: float = MATCH_WAIT_S) -> None:
        self.node, self.publisher, self.wait_s = node, publisher, wait_s
        self.topic = node.resolve_topic_name(publisher.topic_name)
        self._given_up_at = -1  # the subscription count at which the last wait ran out

    def _behind(self) -> int:
        """Subscriptions the graph shows beyond those the writer matched (0 when none)."""
        shown = self.node.count_subscribers(self.topic)
        if shown == self._given_up_at:
            return 0
        return max(0, shown - self.publisher.get_subscription_count())

    def wait(self) -> bool:
        """True once the writer reaches them all (at once, nearly always); False if it gave up."""
        if not self._behind():
            return True
        deadline = time.monotonic() + self.wait_s
        while time.monotonic() < deadline:
            time.sleep(MATCH_POLL_S)
            if not self._behind():
                return True
        self._given_up_at = self.node.count_subscribers(self.topic)
        self.node.get_logger().warning(
            f"{self.topic}: the graph shows {self._given_up_at} subscription(s), the publisher reaches "
            f"{self.publisher.get_subscription_count()} after {self.wait_s:g} s (incompatible QoS?); sending anyway")
        return False


def latched_qos(depth: int = 1):
    """Transient-local durability (ROS 1's latching): a late subscriber gets the last ``depth``
    messages. Publisher and subscriber both need it, on either backend."""
    if rt.BACKEND == "rclpy":  # pragma: no cover - exercised only where ROS 2 is installed
        from rclpy.qos import DurabilityPolicy, QoSProfile

        return QoSProfile(depth=depth, durability=DurabilityPolicy.TRANSIENT_LOCAL)
    return rt.QoSProfile(depth=depth, transient_local=True)


def goal_overrides(goal, max_new_tokens: int) -> dict:
    """GenerationConfig fields from a Generate goal: its sampling settings, seed, stop strings and
    token limit (0: ``max_new_tokens``); ValueError naming a field out of range (the rest are checked
    by GenerationConfig). ``top_p`` 0 is the message's default and means off, as 1 does."""
    top_p, seed = float(goal.top_p), int(goal.seed)
    if not 0.0 <= top_p <= 1.0:  # NaN fails too
        raise ValueError(f"top_p must be in [0, 1] (0 or 1 = off), got {top_p}")
    if seed < -1:
        raise ValueError(f"seed must be >= 0, or -1 for a random seed, got {seed}")
    return dict(max_new_tokens=int(goal.max_new_tokens) or max_new_tokens, temperature=float(goal.temperature),
                top_k=int(goal.top_k), top_p=top_p if top_p > 0 else 1.0, seed=None if seed == -1 else seed,
                stop_strings=tuple(goal.stop))



def nav_adapter_param(value: str, target):
    """The navigation adapter a node's `nav_adapter` parameter names ('shipped' or a folder),
    checked against ``target``; None for ''. ValueError naming the parameter."""
    from edge_llm_ros.nav.vlm import NavAdapter

    if not value:
        return None
    try:
        return NavAdapter.load(None if value == "shipped" else value, target)
    except (OSError, ValueError) as exc:
        raise ValueError(f"parameter 'nav_adapter': {exc}") from None


def cpu_set(text: str) -> set[int]:
    """'0', '1,3', '0-1' (taskset -c's list) -> the cores; '' -> none (any core)."""
    from edge_llm_ros.core.planning.partition import layer_ranges

    return {core for layers in layer_ranges(text.replace(" ", "")) for core in layers} if text.strip() else set()


def pin_process(cores: set[int]) -> None:
    """Every thread of this process (and those it starts later) on ``cores`` only."""
    for task in os.listdir("/proc/self/task"):
        with contextlib.suppress(ProcessLookupError):  # a thread that ended meanwhile
            os.sched_setaffinity(int(task), cores)
