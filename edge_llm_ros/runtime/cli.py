"""`edge-llm-ros`'s verbs shaped like `ros2` (edge_llm_ros.cli hands them here; the engine's
verbs and `demo` it runs itself).

    edge-llm-ros launch pipeline [mode:=tree ...]
    edge-llm-ros topic list|echo|pub|hz|info
    edge-llm-ros node list
    edge-llm-ros service list|call
    edge-llm-ros action list|send_goal
    edge-llm-ros interface show TYPE
    edge-llm-ros bag record|play|info

Exit codes: 0 success, 1 a runtime failure (timeout, server gone), 2 bad
input (unknown type, malformed YAML, a value out of its field's range, missing
file). Failures are one line on stderr in argparse's form:
`edge-llm-ros topic pub: error: std_msgs/msg/Int32.data: 99999999999 is out
of range for int32 [-2147483648, 2147483647]`.
"""

from __future__ import annotations

import argparse
import os
import queue
import signal
import sys
import threading
import time
from typing import Any, Callable

import yaml
from rosbags.typesys.base import Nodetype

from edge_llm_ros.runtime.echo_format import (
    TRUNCATE_LENGTH,
    Shown,
    message_to_csv,
    message_to_plain,
    message_to_yaml,
    rclpy_value,
)
from edge_llm_ros.runtime.interfaces import InterfaceError, registry

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2


class CliError(Exception):
    """A failure reported as one line; `code` is the exit status."""

    def __init__(self, message: str, code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.code = code


# ------------------------------------------------------------------ helpers
def parse_values(text: str, where: str) -> dict:
    try:
        values = yaml.safe_load(text) if text.strip() else {}
    except yaml.YAMLError as exc:
        raise CliError(f"{where}: malformed YAML: {str(exc).splitlines()[0]}") from exc
    except ValueError as exc:  # a number Python will not convert (an integer of more than 4300 digits)
        raise CliError(f"{where}: {str(exc).split(';')[0]}") from exc
    if values is None:
        return {}
    if not isinstance(values, dict):
        raise CliError(f"{where}: expected a YAML mapping like \"{{data: 'hi'}}\", got {text!r}")
    return values


# ------------------------------------------------------- messages as text
# `ros2 topic echo` prints a message with rosidl_runtime_py: message_to_yaml, or message_to_csv with
# --csv; `ros2 action send_goal` prints goals and results with message_to_yaml too. The functions below
# give the same text for our messages. They start from the values rclpy holds: fields in declaration
# order, a byte as a 1-byte `bytes` (YAML shows its character), numeric sequences as array.array of
# Python numbers, fixed-size numeric arrays as numpy arrays, float32 widened to a double.

class Session:
    """A short-lived CLI node plus a thread that runs its callbacks."""

    def __init__(self) -> None:
        from edge_llm_ros.runtime import embedded

        self.rt = embedded
        embedded.init(args=[], install_signal_handlers=False)
        self.node = embedded.Node(f"_edge_llm_ros_cli_{os.getpid()}")
        self._spinner = threading.Thread(target=self._spin, daemon=True)
        self._spinner.start()

    def _spin(self) -> None:
        ctx = self.rt.get_context()
        while ctx.ok():
            self.rt.spin_once(0.2, ctx)

    def resolve_topic_type(self, topic: str, given: str | None, wait_s: float) -> str:
        """The type given, or the one the graph shows for the topic (waiting up to wait_s)."""
        if given:
            return registry().check_message(given)
        topic = self.node.resolve_topic_name(topic)
        deadline = time.monotonic() + wait_s
        while True:
            types = dict(self.node.get_topic_names_and_types()).get(topic)
            if types:
                if len(types) > 1:
                    raise CliError(f"{topic} has several types {types}; name one")
                return types[0]
            if time.monotonic() >= deadline:
                raise CliError(f"could not determine the type of {topic} (no publisher seen in {wait_s:g} s); pass it explicitly", EXIT_FAIL)
            time.sleep(0.1)

    def close(self) -> None:
        if any(isinstance(e, self.rt.Publisher) for e in self.node._entities):
            time.sleep(0.2)  # Zenoh has no flush call: let the last samples leave before the session closes
        self.node.destroy_node()
        self.rt.shutdown()


def wait_forever_or(stop: threading.Event, seconds: float | None) -> None:
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait(seconds)


# ------------------------------------------------------------------- topic
def cmd_topic_list(args: argparse.Namespace, s: Session) -> int:
    for name, types in s.node.get_topic_names_and_types():
        print(f"{name} [{', '.join(types)}]" if args.show_types else name)
    return EXIT_OK


def cmd_topic_info(args: argparse.Namespace, s: Session) -> int:
    topic = s.node.resolve_topic_name(args.topic)
    entries = [e for e in s.node.graph() if e.name == topic and e.kind in ("MP", "MS")]
    types = sorted({e.ros_type for e in entries})
    print(f"Type: {', '.join(types) or 'unknown'}")
    print(f"Publisher count: {sum(e.kind == 'MP' for e in entries)}")
    print(f"Subscription count: {sum(e.kind == 'MS' for e in entries)}")
    return EXIT_OK


def cmd_topic_echo(args: argparse.Namespace, s: Session) -> int:
    """`ros2 topic echo`: each message (or the field --field selects) as ros2 prints it, a `---` line after each."""
    ros_type = s.resolve_topic_type(args.topic, args.type, args.wait)
    steps = field_steps(ros_type, args.field)
    if args.raw and steps:
        raise CliError("--field selects from a message; --raw prints the bytes as they came")
    keep = compile_filter(args.filter_expr)
    shown = Shown(None if args.full_length else args.truncate_length, args.no_arr, args.no_str)
    stop = threading.Event()
    count = [0]
    failed: list[Exception] = []  # --filter's expression raised

    def show(value: Any, text: Callable[[Any], str]) -> None:
        if stop.is_set():
            return
        try:
            if keep is not None and not keep(value):
                return
        except Exception as exc:  # the user's expression: report it and end, as ros2 does
            failed.append(exc)
            stop.set()
            return
        print(text(value), end="", flush=True)
        count[0] += 1
        if args.once or (args.count and count[0] >= args.count):
            stop.set()

    def on_msg(msg: Any) -> None:
        for name, _ in steps:
            msg = getattr(msg, name)
        desc = steps[-1][1] if steps else (Nodetype.NAME, ros_type)
        if desc[0] != Nodetype.NAME:  # a field that is no message: printed as Python prints rclpy's value
            show(rclpy_value(desc, msg), "{}\n---\n".format)
        elif args.csv:
            show(msg, lambda value: message_to_csv(value, shown) + "\n")
        else:
            show(msg, lambda value: message_to_yaml(value, shown, args.flow_style) + "---\n")

    def on_raw(_topic: str, _type: str, data: bytes, _received_ns: int) -> None:  # on Zenoh's thread
        show(data, "{}\n---\n".format)

    if args.raw:
        s.node.create_subscription(ros_type, args.topic, on_raw, 100, raw=True)
    else:
        s.node.create_subscription(ros_type, args.topic, on_msg, 100)
    wait_forever_or(stop, args.timeout)
    if failed:
        raise CliError(f"--filter {args.filter_expr!r} failed: {failed[0]!r}")
    if (args.once or args.count) and not stop.is_set():
        raise CliError(f"no message on {s.node.resolve_topic_name(args.topic)} within {args.timeout:g} s", EXIT_FAIL)
    return EXIT_OK


def field_steps(ros_type: str, path: str | None) -> list[tuple[str, tuple]]:
    """--field 'a.b' as (name, type) of each step from the message down; CliError if one is no field."""
    if path is None:
        return []
    names = [name for name in path.split(".") if name]
    if not names:
        raise CliError(f"Invalid field value '{path}'")
    steps, desc = [], (Nodetype.NAME, ros_type)
    for name in names:
        if desc[0] != Nodetype.NAME:
            raise CliError(f"Invalid field '{path}': '{steps[-1][0]}' is no message, it has no field '{name}'")
        fields = dict(registry().store.fielddefs[desc[1]][1])
        if name not in fields:
            raise CliError(f"Invalid field '{path}': {desc[1]} has no field '{name}'")
        desc = fields[name]
        steps.append((name, desc))
    return steps


def compile_filter(expression: str | None) -> Callable[[Any], bool] | None:
    """--filter: a Python expression of `m` (the message, or the selected field), as ros2 evaluates it."""
    if expression is None:
        return None
    try:
        code = compile(expression, "--filter", "eval")
    except SyntaxError as exc:
        raise CliError(f"--filter: {exc.msg}: {expression!r}") from exc
    return lambda m: bool(eval(code, {}, {"m": m}))  # noqa: S307 - the user's own expression, as ros2 runs it


def cmd_topic_pub(args: argparse.Namespace, s: Session) -> int:
    ros_type = registry().check_message(args.type)
    msg = registry().from_dict(ros_type, parse_values(args.values, args.type))
    pub = s.node.create_publisher(ros_type, args.topic, 10)
    times = 1 if args.once else args.times
    if args.wait_matching > 0 and not pub.wait_for_subscribers(args.wait_matching):
        print(f"warning: no subscriber on {pub.topic_name} after {args.wait_matching:g} s; publishing anyway", file=sys.stderr)
    print(f"publisher: beginning loop\npublishing #1: {message_to_plain(msg)}", flush=True)
    sent = 0
    stop = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    while not stop.is_set():
        pub.publish(msg)
        sent += 1
        if times and sent >= times:
            break
        stop.wait(1.0 / args.rate)
    return EXIT_OK


def cmd_topic_hz(args: argparse.Namespace, s: Session) -> int:
    ros_type = s.resolve_topic_type(args.topic, args.type, args.wait)
    stamps: list[float] = []
    lock = threading.Lock()

    def on_msg(*_a: Any) -> None:
        with lock:
            stamps.append(time.monotonic())

    s.node.create_subscription(ros_type, args.topic, on_msg, 100, raw=True)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    deadline = None if args.duration is None else time.monotonic() + args.duration
    while not stop.wait(1.0):
        with lock:
            window = stamps[-args.window:]
        if len(window) >= 2:
            gaps = [b - a for a, b in zip(window, window[1:])]
            mean = sum(gaps) / len(gaps)
            print(f"average rate: {1.0 / mean:.3f}\n\tmin: {min(gaps):.3f}s max: {max(gaps):.3f}s window: {len(window)}", flush=True)
        if deadline is not None and time.monotonic() >= deadline:
            break
    return EXIT_OK


# ------------------------------------------------------------- node/service
def cmd_node_list(args: argparse.Namespace, s: Session) -> int:
    own = s.node.get_fully_qualified_name()
    for name, ns in s.node.get_node_names_and_namespaces():
        fqn = f"{ns.rstrip('/')}/{name}"
        if fqn != own:
            print(fqn)
    return EXIT_OK


def cmd_service_list(args: argparse.Namespace, s: Session) -> int:
    for name, types in s.node.get_service_names_and_types():
        print(f"{name} [{', '.join(types)}]" if args.show_types else name)
    return EXIT_OK


def cmd_service_call(args: argparse.Namespace, s: Session) -> int:
    srv = registry().service(args.type)
    request = registry().from_dict(srv.request, parse_values(args.values, srv.request))
    client = s.node.create_client(srv.name, args.service)
    if not client.wait_for_service(args.timeout):
        raise CliError(f"service {client.srv_name} is not available (waited {args.timeout:g} s)", EXIT_FAIL)
    print(f"requester: making request: {message_to_plain(request)}\n", flush=True)
    try:
        response = client.call(request, timeout_sec=args.timeout)
    except TimeoutError as exc:
        raise CliError(str(exc), EXIT_FAIL) from exc
    print("response:\n" + message_to_yaml(response), flush=True)
    return EXIT_OK


# ---------------------------------------------------------------- lifecycle
# `ros2 lifecycle`: a managed node (runtime/lifecycle.py) serves <node>/get_state, change_state and
# get_available_transitions; the output is worded as ros2lifecycle's.

def _lifecycle_call(s: Session, node: str, service: str, srv_type: str, request: dict, timeout: float) -> Any:
    srv = registry().service(f"lifecycle_msgs/srv/{srv_type}")
    client = s.node.create_client(srv.name, f"{node.rstrip('/')}/{service}")
    if not client.wait_for_service(timeout):
        raise CliError(f"Node not found: {node} serves no {service} (is it a managed node? waited {timeout:g} s)",
                       EXIT_FAIL)
    try:
        return client.call(registry().from_dict(srv.request, request), timeout_sec=timeout)
    except TimeoutError as exc:
        raise CliError(str(exc), EXIT_FAIL) from exc


def cmd_lifecycle_nodes(args: argparse.Namespace, s: Session) -> int:
    suffix = "/get_state"
    for name, types in s.node.get_service_names_and_types():
        if name.endswith(suffix) and "lifecycle_msgs/srv/GetState" in types:
            print(name[: -len(suffix)])
    return EXIT_OK


def cmd_lifecycle_get(args: argparse.Namespace, s: Session) -> int:
    state = _lifecycle_call(s, args.node, "get_state", "GetState", {}, args.timeout).current_state
    print(f"{state.label} [{state.id}]")
    return EXIT_OK


def cmd_lifecycle_list(args: argparse.Namespace, s: Session) -> int:
    response = _lifecycle_call(s, args.node, "get_available_transitions", "GetAvailableTransitions", {},
                               args.timeout)
    for t in response.available_transitions:
        print(f"- {t.transition.label} [{t.transition.id}]\n\tStart: {t.start_state.label}\n\tGoal: {t.goal_state.label}")
    return EXIT_OK


def cmd_lifecycle_set(args: argparse.Namespace, s: Session) -> int:
    response = _lifecycle_call(s, args.node, "get_available_transitions", "GetAvailableTransitions", {},
                               args.timeout)
    labels = {t.transition.label: t.transition.id for t in response.available_transitions}
    wanted = labels.get(args.transition) or (int(args.transition) if args.transition.isdigit() else None)
    if wanted not in labels.values():
        raise CliError("Unknown transition requested, available ones are: "
                       + ", ".join(f"{label} [{tid}]" for label, tid in labels.items()), EXIT_FAIL)
    result = _lifecycle_call(s, args.node, "change_state", "ChangeState", {"transition": {"id": wanted}},
                             args.transition_timeout)
    if not result.success:
        raise CliError("Transitioning failed", EXIT_FAIL)
    print("Transitioning successful")
    return EXIT_OK


# ------------------------------------------------------------------- action
def cmd_action_list(args: argparse.Namespace, s: Session) -> int:
    suffix = "/_action/send_goal"
    for name, types in s.node.get_service_names_and_types():
        if name.endswith(suffix):
            base = name[: -len(suffix)]
            types = [t.replace("_SendGoal", "") for t in types]
            print(f"{base} [{', '.join(types)}]" if args.show_types else base)
    return EXIT_OK


def cmd_action_send_goal(args: argparse.Namespace, s: Session) -> int:
    from edge_llm_ros.runtime import goals
    from edge_llm_ros.runtime.actions import STATUS_NAMES, STATUS_SUCCEEDED, ActionClient

    spec = registry().action(args.type)
    goal = registry().from_dict(spec.goal, parse_values(args.values, spec.goal))
    client = ActionClient(s.node, spec.name, args.action, call_timeout=args.timeout)
    print("Waiting for an action server to become available...", flush=True)
    if not client.wait_for_server(args.timeout):
        raise CliError(f"action server {client.name} is not available (waited {args.timeout:g} s)", EXIT_FAIL)
    print(f"Sending goal:\n     {message_to_yaml(goal)}", flush=True)  # ros2's indent, on the first line only
    streaming = [False]
    failed = threading.Event()  # no more streamed text once the error line is due
    output = threading.Lock()  # a feedback being written, or the error line's newline: one at a time

    def on_feedback(fb_msg: Any) -> None:
        with output:
            if failed.is_set():
                return
            fb = fb_msg.feedback
            if hasattr(fb, "text_delta"):  # stream text as it comes, like a chat client
                sys.stdout.write(fb.text_delta)
                sys.stdout.flush()
                streaming[0] = True
            elif args.feedback:
                print(f"Feedback:\n    {message_to_yaml(fb)}", flush=True)

    try:  # the waiting code edge_llm_ros.client uses too (runtime/goals.py)
        handle = goals.send_goal(client, goal, on_feedback, args.timeout + 5)
        if not handle.accepted:
            print("Goal was rejected.", flush=True)
            return EXIT_FAIL
        print(f"Goal accepted with ID: {goals.goal_name(handle)}\n", flush=True)
        stop = threading.Event()  # Ctrl-C: cancel the goal, and wait for the result the cancel brings
        signal.signal(signal.SIGINT, lambda *_: stop.set())
        response = goals.wait_result(client, handle, None, stop=stop)
    except (TimeoutError, RuntimeError) as exc:  # no answer in time, the server went away, the goal call failed
        with output:  # a feedback written meanwhile would glue its text to the error line (CI, session 12)
            failed.set()
            if streaming[0]:
                print(flush=True)  # end the streamed text's line
        raise CliError(str(exc), EXIT_FAIL) from exc
    if streaming[0]:
        print("\n")
    print(f"Result:\n    {message_to_yaml(response.result)}", flush=True)
    print(f"Goal finished with status: {STATUS_NAMES.get(response.status, response.status)}", flush=True)
    return EXIT_OK if response.status == STATUS_SUCCEEDED else EXIT_FAIL


# ---------------------------------------------------------------- interface
def cmd_interface_show(args: argparse.Namespace) -> int:
    name = args.type
    reg = registry()
    parts = name.strip("/").split("/")
    kind = parts[1] if len(parts) == 3 else "msg"
    if kind == "srv":
        srv = reg.service(name)
        print(reg.msgdef(srv.request).split("\n====")[0].rstrip() + "\n---\n" + reg.msgdef(srv.response).split("\n====")[0].rstrip())
    elif kind == "action":
        act = reg.action(name)
        print("\n---\n".join(reg.msgdef(t).split("\n====")[0].rstrip() for t in (act.goal, act.result, act.feedback)))
    else:
        print(reg.msgdef(name).split("\n====")[0].rstrip())
    return EXIT_OK


# ---------------------------------------------------------------------- bag
def cmd_bag_info(args: argparse.Namespace) -> int:
    from edge_llm_ros.runtime import bag

    print(bag.format_info(bag.info(args.path)))
    return EXIT_OK


def cmd_bag_record(args: argparse.Namespace, s: Session) -> int:
    from edge_llm_ros.runtime import bag

    if not args.all and not args.topics:
        raise CliError("name topics to record, or pass --all")
    out = args.output or time.strftime("rosbag2_%Y_%m_%d-%H_%M_%S")
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    subscriptions = []
    arrived: queue.SimpleQueue = queue.SimpleQueue()  # written from this thread: sqlite3 is thread-bound
    with bag.BagWriter(out, storage=args.storage) as writer:
        recorder = bag.Recorder(writer)
        subscribed: set[str] = set()
        wanted = {s.node.resolve_topic_name(t) for t in args.topics}
        deadline = None if args.duration is None else time.monotonic() + args.duration
        next_scan = 0.0
        print(f"[INFO] [bag record]: recording to {out} ({args.storage})", file=sys.stderr, flush=True)
        while not stop.is_set():
            if time.monotonic() >= next_scan:  # pick up topics that appear later
                next_scan = time.monotonic() + 0.5
                for topic, types in s.node.get_topic_names_and_types():
                    if topic in subscribed or (not args.all and topic not in wanted) or "/_action/" in topic:
                        continue
                    subscriptions.append(s.node.create_subscription(
                        types[0], topic, lambda *sample: arrived.put(sample), 1000, raw=True))
                    subscribed.add(topic)
                    print(f"[INFO] [bag record]: subscribed to {topic} ({types[0]})", file=sys.stderr, flush=True)
            _drain(arrived, recorder, 0.1)
            if (deadline is not None and time.monotonic() >= deadline) or (
                    args.max_messages and recorder.count >= args.max_messages):
                break
        for sub in subscriptions:
            sub.destroy()
        _drain(arrived, recorder, 0.0)
    print(f"[INFO] [bag record]: wrote {recorder.count} messages to {out}", file=sys.stderr, flush=True)
    return EXIT_OK


def _drain(arrived: queue.SimpleQueue, recorder: Any, wait: float) -> None:
    """Write what the subscriptions queued, waiting up to `wait` s for the first sample."""
    try:
        sample = arrived.get(timeout=wait) if wait > 0 else arrived.get_nowait()
        while True:
            recorder.on_message(*sample)
            sample = arrived.get_nowait()
    except queue.Empty:
        return


def cmd_bag_play(args: argparse.Namespace, s: Session) -> int:
    from edge_llm_ros.runtime import bag

    reader = bag.BagReader(args.path)
    bag.require_topics(reader, dict(required_topic(text) for text in args.require or ()))
    publishers: dict[str, Any] = {}
    for topic, ros_type, _count, _fmt in reader.topics():
        if args.topics and topic not in args.topics:
            continue
        registry().check_message(ros_type)
        publishers[topic] = s.node.create_publisher(ros_type, topic, 1000)
    # Give subscribers that already exist time to be matched before the first message.
    for topic, pub in publishers.items():
        if s.node.count_subscribers(topic):
            pub.wait_for_subscribers(args.wait_matching)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())

    def publish(topic: str, _ros_type: str, data: bytes) -> None:
        publishers[topic].publish_raw(data)

    publish_clock = None
    if args.clock:  # as rosbag2's player: /clock, keep last 1, best effort (rclcpp::ClockQoS)
        from edge_llm_ros.runtime.embedded import CLOCK_TOPIC, QoSProfile

        Clock = registry().message_class("rosgraph_msgs/msg/Clock")
        clock_pub = s.node.create_publisher(Clock, CLOCK_TOPIC, QoSProfile(depth=1, reliable=False))

        def publish_clock(ns: int) -> None:
            msg = Clock()
            msg.clock.sec, msg.clock.nanosec = divmod(ns, 1_000_000_000)
            clock_pub.publish(msg)

    count = bag.play(reader, publish, rate=args.rate, topics=set(publishers), loop=args.loop, stop=stop,
                     clock_hz=args.clock, publish_clock=publish_clock)
    print(f"[INFO] [bag play]: published {count} messages", file=sys.stderr, flush=True)
    return EXIT_OK


def required_topic(text: str) -> tuple[str, str | None]:
    """`--require` takes TOPIC or TOPIC:TYPE (a topic name has no ':')."""
    topic, _, ros_type = text.partition(":")
    if not topic.startswith("/"):
        raise CliError(f"--require: expected /topic or /topic:pkg/msg/Type, got {text!r}")
    return topic, (registry().check_message(ros_type) if ros_type else None)


# ------------------------------------------------------------------ parser
CLOCK_HZ = 40.0  # `ros2 bag play --clock` without a value (rosbag2's play verb: const=40)


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not (value > 0 and value < float("inf")):
        raise argparse.ArgumentTypeError(f"{text} is not a positive number")
    return value


def unsigned_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text} is not an unsigned integer")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="edge-llm-ros", description="ros2-style tools for edge_llm_ros (embedded Zenoh backend)",
        epilog="more verbs: demo, generate, bench, train, plan, export, top, plot, security (each has --help). "
               "Every graph verb takes --keystore DIR --enclave NAME: its session then joins a secured "
               "deployment as that enclave (or set ZENOH_SESSION_CONFIG_URI to the enclave's config)")
    verbs = p.add_subparsers(dest="verb", required=True)

    launch = verbs.add_parser("launch", help="run a deployment: launch file name or params YAML", add_help=False)
    launch.add_argument("rest", nargs=argparse.REMAINDER)

    topic = verbs.add_parser("topic", help="topics").add_subparsers(dest="sub", required=True)
    t = topic.add_parser("list")
    t.add_argument("-t", "--show-types", action="store_true")
    t.set_defaults(func=cmd_topic_list)
    t = topic.add_parser("info")
    t.add_argument("topic")
    t.set_defaults(func=cmd_topic_info)
    t = topic.add_parser("echo")
    t.add_argument("topic")
    t.add_argument("type", nargs="?")
    t.add_argument("--csv", action="store_true", help="one line of comma-separated values per message")
    t.add_argument("--field", help="echo one field of the message ('.' selects sub-fields, e.g. header.stamp)")
    t.add_argument("-f", "--full-length", action="store_true", help="show arrays and strings whole")
    t.add_argument("-l", "--truncate-length", type=unsigned_int, default=TRUNCATE_LENGTH,
                   help=f"cut arrays and strings after this many elements (default: {TRUNCATE_LENGTH})")
    t.add_argument("--no-arr", action="store_true", help="show arrays by their type and length only")
    t.add_argument("--no-str", action="store_true", help="show strings by their length only")
    t.add_argument("--flow-style", action="store_true", help="print collections in YAML's flow style")
    t.add_argument("--raw", action="store_true", help="print each message's CDR bytes")
    t.add_argument("--filter", dest="filter_expr", help="print only messages for which this Python expression "
                   "of m (the message) is true")
    t.add_argument("--once", action="store_true", help="exit after the first message")
    t.add_argument("--count", type=int, default=0, help="exit after this many messages")
    t.add_argument("--timeout", type=float, default=None, help="give up after this many seconds")
    t.add_argument("--wait", type=float, default=10.0, help="seconds to wait for a publisher to learn the type")
    t.set_defaults(func=cmd_topic_echo)
    t = topic.add_parser("pub")
    t.add_argument("topic")
    t.add_argument("type")
    t.add_argument("values", nargs="?", default="{}")
    t.add_argument("-1", "--once", action="store_true")
    t.add_argument("-t", "--times", type=int, default=0, help="publish this many times, then exit")
    t.add_argument("-r", "--rate", type=float, default=1.0)
    t.add_argument("-w", "--wait-matching", type=float, default=5.0, help="seconds to wait for a subscriber first")
    t.set_defaults(func=cmd_topic_pub)
    t = topic.add_parser("hz")
    t.add_argument("topic")
    t.add_argument("type", nargs="?")
    t.add_argument("--window", type=int, default=100)
    t.add_argument("--duration", type=float, default=None)
    t.add_argument("--wait", type=float, default=10.0)
    t.set_defaults(func=cmd_topic_hz)

    node = verbs.add_parser("node", help="nodes").add_subparsers(dest="sub", required=True)
    node.add_parser("list").set_defaults(func=cmd_node_list)

    service = verbs.add_parser("service", help="services").add_subparsers(dest="sub", required=True)
    t = service.add_parser("list")
    t.add_argument("-t", "--show-types", action="store_true")
    t.set_defaults(func=cmd_service_list)
    t = service.add_parser("call")
    t.add_argument("service")
    t.add_argument("type")
    t.add_argument("values", nargs="?", default="{}")
    t.add_argument("--timeout", type=float, default=10.0)
    t.set_defaults(func=cmd_service_call)

    lifecycle = verbs.add_parser("lifecycle", help="managed nodes").add_subparsers(dest="sub", required=True)
    lifecycle.add_parser("nodes").set_defaults(func=cmd_lifecycle_nodes)
    for verb, func in (("get", cmd_lifecycle_get), ("list", cmd_lifecycle_list), ("set", cmd_lifecycle_set)):
        t = lifecycle.add_parser(verb)
        t.add_argument("node")
        if verb == "set":
            t.add_argument("transition", help="configure | activate | deactivate | cleanup | shutdown, or its id")
            t.add_argument("--transition-timeout", type=float, default=300.0,
                           help="seconds to wait for the transition (configure loads a model)")
        t.add_argument("--timeout", type=float, default=10.0, help="seconds to wait for the node")
        t.set_defaults(func=func)

    action = verbs.add_parser("action", help="actions").add_subparsers(dest="sub", required=True)
    t = action.add_parser("list")
    t.add_argument("-t", "--show-types", action="store_true")
    t.set_defaults(func=cmd_action_list)
    t = action.add_parser("send_goal")
    t.add_argument("action")
    t.add_argument("type")
    t.add_argument("values", nargs="?", default="{}")
    t.add_argument("-f", "--feedback", action="store_true", help="print every feedback message")
    t.add_argument("--timeout", type=float, default=10.0, help="seconds to wait for the server and each call")
    t.set_defaults(func=cmd_action_send_goal)

    interface = verbs.add_parser("interface", help="message definitions").add_subparsers(dest="sub", required=True)
    t = interface.add_parser("show")
    t.add_argument("type")
    t.set_defaults(func=cmd_interface_show, offline=True)

    bagp = verbs.add_parser("bag", help="rosbag2 files").add_subparsers(dest="sub", required=True)
    t = bagp.add_parser("info")
    t.add_argument("path")
    t.set_defaults(func=cmd_bag_info, offline=True)
    t = bagp.add_parser("record")
    t.add_argument("topics", nargs="*")
    t.add_argument("-a", "--all", action="store_true")
    t.add_argument("-o", "--output")
    t.add_argument("-s", "--storage", default="mcap", choices=["mcap", "sqlite3"])
    t.add_argument("-d", "--duration", type=float, default=None, help="stop after this many seconds")
    t.add_argument("--max-messages", type=int, default=0, help="stop after this many messages")
    t.set_defaults(func=cmd_bag_record)
    t = bagp.add_parser("play")
    t.add_argument("path")
    t.add_argument("-r", "--rate", type=float, default=1.0)
    t.add_argument("--topics", nargs="*")
    t.add_argument("-l", "--loop", action="store_true")
    t.add_argument("--wait-matching", type=float, default=3.0, help="seconds to wait for known subscribers to match")
    t.add_argument("--clock", type=positive_float, nargs="?", const=CLOCK_HZ, default=0.0, metavar="HZ",
                   help=f"publish the bag's time on /clock (rosgraph_msgs/Clock) HZ times a second (default "
                        f"{CLOCK_HZ:g}, as ros2 bag play --clock), for nodes run with use_sim_time:=true")
    t.add_argument("--require", nargs="+", metavar="TOPIC[:TYPE]",
                   help="fail before publishing anything unless the bag has messages on these topics (of this type)")
    t.set_defaults(func=cmd_bag_play)
    return p


def _fail(args: argparse.Namespace, message: str, code: int) -> int:
    """Say what failed in one line, as argparse says a usage error (`edge-llm-ros topic pub: error: ...`)."""
    prog = " ".join(["edge-llm-ros", args.verb, getattr(args, "sub", "")]).rstrip()
    print(f"{prog}: error: {message}", file=sys.stderr)
    return code


def take_enclave_options(argv: list[str]) -> tuple[list[str], str | None, str | None]:
    """`--keystore DIR` and `--enclave NAME`, wherever they stand among a verb's arguments."""
    rest, found = [], {"--keystore": None, "--enclave": None}
    items = iter(argv)
    for item in items:
        flag, eq, value = item.partition("=")
        if flag in found:
            found[flag] = value if eq else next(items, "")
        else:
            rest.append(item)
    return rest, found["--keystore"], found["--enclave"]


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "launch":
        from edge_llm_ros.runtime.launcher import main as launch_main

        return launch_main(argv[1:])
    argv, keystore, enclave = take_enclave_options(argv)
    if keystore is not None or enclave is not None:  # this command's session as that enclave (mTLS, its rules)
        from edge_llm_ros.runtime.security import SecurityError, use_enclave

        try:
            if not keystore or not enclave:
                raise SecurityError("--keystore DIR and --enclave NAME go together")
            use_enclave(keystore, enclave)
        except SecurityError as exc:
            print(f"edge-llm-ros: error: {exc}", file=sys.stderr)
            return EXIT_USAGE
    args = build_parser().parse_args(argv)
    from edge_llm_ros.runtime.bag import BagError
    from edge_llm_ros.runtime.params import ParamsError

    session = None
    try:
        if getattr(args, "offline", False):
            return args.func(args)
        session = Session()
        return args.func(args, session)
    except CliError as exc:
        return _fail(args, str(exc), exc.code)
    except (InterfaceError, ParamsError, BagError) as exc:
        return _fail(args, str(exc), EXIT_USAGE)
    except KeyboardInterrupt:
        return EXIT_OK
    finally:
        if session is not None:
            session.close()


if __name__ == "__main__":
    raise SystemExit(main())
