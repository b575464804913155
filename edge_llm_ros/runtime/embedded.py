"""The embedded backend: the rclpy subset our nodes use, on Zenoh.

Wire behaviour follows rmw_zenoh (see graph.py), so a ROS 2 system running
rmw_zenoh_cpp sees these nodes and topics. Semantics follow rclpy where the
nodes depend on them:

- callbacks (subscriptions, timers, service requests, futures) run in an
  executor, one at a time, when the program spins; Zenoh's own threads only
  deserialize and enqueue;
- a message that does not deserialize, or arrives with another type or hash
  than the subscription's, is logged as an error naming topic and type and is
  dropped; the node keeps serving;
- a client call to a server that is gone fails with ServiceTimeoutError after
  its timeout, never hangs;
- graph queries (counts, lists, service_is_ready) read a per-process graph
  cache kept by a liveliness subscriber (GraphCache), as rmw_zenoh's is: a
  token leaves it when its node undeclares it or its process dies;
- transient-local durability (``QoSProfile(transient_local=True)``) latches as
  in ROS 2, the rmw_zenoh way: such a publisher is a zenoh-ext AdvancedPublisher
  caching its last ``depth`` messages, such a subscription an AdvancedSubscriber
  that asks every publisher's cache for them when it starts and when a
  publisher appears later (so a late subscriber gets the last message);
- a node whose `link_emulation` parameters put a topic on an emulated link
  (link.py) publishes on that topic through the link: every publisher of the
  node on that topic, action feedback/status topics included. Service
  requests and replies (and so action goals, results, cancels) are not shaped.
"""

from __future__ import annotations

import inspect
import itertools
import json
import os
import queue
import signal
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable

import zenoh
import zenoh.ext

from edge_llm_ros.runtime import graph, security, stopping
from edge_llm_ros.runtime.interfaces import InterfaceError, registry
from edge_llm_ros.runtime.link import Link, NodeLinks, parse_link_params
from edge_llm_ros.runtime.params import ParamsError, RosArgs, parse_ros_args, resolve_name
from edge_llm_ros.runtime.throttle import flood_note

ROUTER_WAIT_S = float(os.environ.get("EDGE_LLM_ROUTER_WAIT_S", "10"))
GRAPH_QUERY_FLOOR_S = 2.0  # the least a graph query waits for the router (it returns at the answer)
GRAPH_LATE_WINDOW_S = 1.0  # a first graph call after the young window still asks this long
LOG_LEVELS = {"debug": 10, "info": 20, "warn": 30, "warning": 30, "error": 40, "fatal": 50}


class ServiceTimeoutError(TimeoutError):
    """A service or action server did not answer in time (usually: it is gone)."""


class ParameterError(ValueError):
    """An undeclared parameter, or a value of the wrong type."""


# --------------------------------------------------------------------- futures
class Future:
    """A result that arrives later (rclpy.task.Future's methods)."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self._result: Any = None
        self._exception: BaseException | None = None
        self._callbacks: list[Callable[[Future], None]] = []
        self._lock = threading.Lock()

    def done(self) -> bool:
        return self._event.is_set()

    def set_result(self, result: Any) -> None:
        self._finish(result, None)

    def set_exception(self, exc: BaseException) -> None:
        self._finish(None, exc)

    def _finish(self, result: Any, exc: BaseException | None) -> None:
        with self._lock:
            if self._event.is_set():
                return
            self._result, self._exception = result, exc
            self._event.set()
            callbacks = list(self._callbacks)
        for cb in callbacks:
            cb(self)

    def add_done_callback(self, cb: Callable[[Future], None]) -> None:
        with self._lock:
            if not self._event.is_set():
                self._callbacks.append(cb)
                return
        cb(self)

    def exception(self) -> BaseException | None:
        return self._exception

    def result(self, timeout: float | None = None) -> Any:
        """The result (raises the failure); waits up to `timeout` seconds when given."""
        if timeout is not None and not self._event.wait(timeout):
            raise TimeoutError(f"no result within {timeout} s")
        if self._exception is not None:
            raise self._exception
        return self._result

    def wait(self, timeout: float | None = None) -> bool:
        return self._event.wait(timeout)


# ---------------------------------------------------------------------- graph
class GraphCache:
    """This process's view of the ROS graph, kept current as rmw_zenoh's graph cache is: one
    liveliness subscriber on every token of the domain. A token arrives as a PUT when it is
    declared (or was already there: the subscriber's history) and leaves as a DELETE when it is
    undeclared, or when the router drops it (its session closed, its link broke, its lease ran
    out). Queries read the cache; nothing asks the router, so a loaded machine cannot make a live
    peer look absent (a slow snapshot once did)."""

    def __init__(self, session: zenoh.Session, domain_id: int) -> None:
        self.started = time.monotonic()
        self._session, self._key = session, f"{graph.ADMIN_SPACE}/{domain_id}/**"
        self._entries: dict[str, graph.GraphEntry] = {}
        self._lock = threading.Lock()
        self._listeners: list[Callable[[graph.GraphEntry, bool], None]] = []
        self.complete = False  # a query's answer is in (or the young window passed): the cache alone answers
        self._queries = 0  # liveliness queries under way
        self._deleted: set[str] = set()  # tokens deleted while one was
        self._sub = session.liveliness().declare_subscriber(self._key, self._on_token, history=True)

    def _on_token(self, sample: zenoh.Sample) -> None:
        key = str(sample.key_expr)
        entry = graph.parse_token(key)
        if entry is None:
            return
        alive = sample.kind == zenoh.SampleKind.PUT
        with self._lock:
            if alive:
                self._entries[key] = entry
                self._deleted.discard(key)
            else:
                self._entries.pop(key, None)
                if self._queries:
                    self._deleted.add(key)
            listeners = list(self._listeners)
        for listener in listeners:
            listener(entry, alive)

    def query(self, timeout: float) -> list[graph.GraphEntry]:
        """Ask the router for every token at once and add them (the subscriber's history brings them
        too, but one by one); a token deleted meanwhile is not brought back. Returns the answer."""
        with self._lock:
            self._queries += 1
        found = {}
        try:
            for reply in self._session.liveliness().get(self._key, timeout=timeout):
                if reply.ok is not None and (entry := graph.parse_token(str(reply.ok.key_expr))) is not None:
                    found[str(reply.ok.key_expr)] = entry
        finally:
            with self._lock:
                self._queries -= 1
                self._entries.update({k: e for k, e in found.items() if k not in self._deleted})
                if not self._queries:
                    self._deleted.clear()
        return list(found.values())

    def entries(self) -> list[graph.GraphEntry]:
        with self._lock:
            return list(self._entries.values())

    def listen(self, listener: Callable[[graph.GraphEntry, bool], None]) -> Callable[[], None]:
        """Call ``listener(entry, alive)`` on every token that comes or goes; returns the undo."""
        with self._lock:
            self._listeners.append(listener)

        def remove() -> None:
            with self._lock:
                if listener in self._listeners:
                    self._listeners.remove(listener)
        return remove


# -------------------------------------------------------------------- context
class Context:
    """One per process: the Zenoh session, the executor queue and shutdown state."""

    def __init__(self, args: list[str] | None = None, domain_id: int | None = None) -> None:
        self.argv = list(sys.argv if args is None else args)
        self.ros_args: RosArgs = parse_ros_args(self.argv)
        self.domain_id = int(os.environ.get("ROS_DOMAIN_ID", "0")) if domain_id is None else domain_id
        from edge_llm_ros.runtime.router import (  # late: `python -m ...router` must not import itself first
            ENDPOINT_ENV,
            router_endpoint,
        )

        endpoint = router_endpoint()
        secured = security.session_config_uri()
        if secured and ENDPOINT_ENV not in os.environ:  # the config file's router
            endpoint = next(iter(security.config_endpoints(secured, "connect")), endpoint)
        self.session = zenoh.open(_session_config(endpoint))
        self.zid = str(self.session.info.zid())
        self._wait_for_router(endpoint, ROUTER_WAIT_S)
        self.graph = GraphCache(self.session, self.domain_id)
        self.queue: queue.SimpleQueue = queue.SimpleQueue()
        self.shutdown_event = threading.Event()
        self._ids = itertools.count()
        self._lock = threading.Lock()

    def _wait_for_router(self, endpoint: str, timeout: float) -> None:
        """Graph queries and publications need the router; wait for it as rmw_zenoh does."""
        deadline = time.monotonic() + timeout
        while not list(self.session.info.routers_zid()):
            if time.monotonic() >= deadline:
                print(f"[WARN] no zenoh router at {endpoint} after {timeout:g} s; start one with "
                      "`python -m edge_llm_ros.runtime.router` (edge-llm-ros launch starts one); "
                      "continuing, peers will be found when it appears", file=sys.stderr, flush=True)
                return
            time.sleep(0.02)

    def next_id(self) -> int:
        with self._lock:
            return next(self._ids)

    def post(self, fn: Callable, *args: Any) -> None:
        """Run fn(*args) on the executor (callable from any thread)."""
        self.queue.put((fn, args))

    def ok(self) -> bool:
        return not self.shutdown_event.is_set()

    def shutdown(self) -> None:
        if self.shutdown_event.is_set():
            return
        self.shutdown_event.set()
        self.queue.put(None)

    def close(self) -> None:
        self.shutdown()
        try:
            self.session.close()
        except zenoh.ZError:
            pass


def _session_config(endpoint: str) -> zenoh.Config:
    """Loopback peers meeting at the router; with ZENOH_SESSION_CONFIG_URI (an enclave's config from a
    keystore, runtime/security.py) that file, its TLS files checked, connecting to `endpoint`."""
    secured = security.session_config_uri()
    if secured:
        return security.load_config(secured, connect=endpoint)
    conf = zenoh.Config()
    conf.insert_json5("mode", json.dumps("peer"))
    conf.insert_json5("connect/endpoints", json.dumps([endpoint]))
    conf.insert_json5("scouting/multicast/enabled", "false")
    conf.insert_json5("listen/endpoints", json.dumps(["tcp/127.0.0.1:0"]))
    # as rmw_zenoh's session config: the publisher caches of transient-local topics need timestamps
    conf.insert_json5("timestamping/enabled", json.dumps({"router": True, "peer": True, "client": True}))
    return conf


_context: Context | None = None
_context_lock = threading.Lock()


def init(args: list[str] | None = None, install_signal_handlers: bool = True) -> Context:
    """Start the process's context (rclpy.init); SIGINT/SIGTERM then shut it down cleanly."""
    global _context
    with _context_lock:
        if _context is None or not _context.ok():
            _context = Context(args)
    if install_signal_handlers and threading.current_thread() is threading.main_thread():
        # As rclpy does: SIGINT and SIGTERM shut the context down, spin() returns,
        # and the node cleans up (also when a shell started us with SIGINT ignored);
        # a stoppable call ends at once (runtime/stopping.py).
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, _on_shutdown_signal)
    return _context


def _on_shutdown_signal(signum: int, frame: Any) -> None:
    context = _context
    if context is not None:
        context.shutdown()
    stopping.signalled(frame)


def get_context() -> Context:
    if _context is None:
        raise RuntimeError("call runtime.init() before creating nodes")
    return _context


def ok() -> bool:
    return _context is not None and _context.ok()


def shutdown() -> None:
    global _context
    with _context_lock:
        if _context is not None:
            _context.close()
            _context = None


# ------------------------------------------------------------------- executor
def spin_once(timeout_sec: float | None = None, context: Context | None = None) -> bool:
    """Run at most one queued callback; False when nothing ran."""
    ctx = context or get_context()
    try:
        item = ctx.queue.get(timeout=timeout_sec) if timeout_sec != 0 else ctx.queue.get_nowait()
    except queue.Empty:
        return False
    if item is None:  # shutdown wake-up
        ctx.queue.put(None)
        return False
    fn, args = item
    fn(*args)
    return True


def spin(node: Any = None, context: Context | None = None) -> None:
    """Run callbacks until shutdown (Ctrl-C / SIGTERM, or shutdown() from elsewhere)."""
    ctx = context or get_context()
    while ctx.ok():
        spin_once(0.5, ctx)


def spin_until_future_complete(node: Any, future: Future, timeout_sec: float | None = None) -> None:
    ctx = get_context()
    deadline = None if timeout_sec is None else time.monotonic() + timeout_sec
    while ctx.ok() and not future.done():
        left = 0.1 if deadline is None else min(0.1, deadline - time.monotonic())
        if left <= 0:
            return
        spin_once(left, ctx)


# ------------------------------------------------------------------- logging
class Logger:
    """rclpy-style logger: `[LEVEL] [time] [name]: message` on stderr."""

    def __init__(self, name: str, level: str = "info") -> None:
        self.name = name
        self.level = LOG_LEVELS.get(level.lower(), 20)

    def set_level(self, level: str) -> None:
        self.level = LOG_LEVELS[level.lower()]

    _write_lock = threading.Lock()  # one line at a time: lines from several threads never interleave

    def _log(self, level: str, value: int, message: str) -> None:
        if value >= self.level:
            line = f"[{level}] [{time.time():.6f}] [{self.name}]: {message}\n"
            with Logger._write_lock:
                sys.stderr.write(line)
                sys.stderr.flush()

    def debug(self, message: str) -> None:
        self._log("DEBUG", 10, message)

    def info(self, message: str) -> None:
        self._log("INFO", 20, message)

    def warning(self, message: str) -> None:
        self._log("WARN", 30, message)

    warn = warning

    def error(self, message: str) -> None:
        self._log("ERROR", 40, message)

    def fatal(self, message: str) -> None:
        self._log("FATAL", 50, message)


# --------------------------------------------------------------------- time
@dataclass(frozen=True)
class Time:
    """A point in time as rclpy.time.Time holds it: nanoseconds since the Unix epoch."""

    nanoseconds: int = 0

    def to_msg(self) -> Any:
        """builtin_interfaces/msg/Time, as a header's stamp takes it."""
        sec, nanosec = divmod(self.nanoseconds, 1_000_000_000)
        return registry().new("builtin_interfaces/msg/Time", sec=sec, nanosec=nanosec)


CLOCK_TOPIC = "/clock"  # rosgraph_msgs/msg/Clock, as rclpy's TimeSource subscribes it


class Clock:
    """rclpy's node clock (ROS time): system time, or with `use_sim_time` the last time on /clock.

    As in rclpy, a node whose `use_sim_time` is true reads 0 until the first /clock arrives and then
    the last one it received; its timers wait on that time (a timer fires when /clock passes its
    next due time; time going backwards, a bag replayed again, restarts its period from then).
    """

    def __init__(self) -> None:
        self._sim_ns: int | None = None  # None: system time
        self._ticks = 0  # /clock messages received
        self._changed = threading.Condition()

    @property
    def ros_time_is_active(self) -> bool:
        """rclpy's name: whether the time comes from /clock."""
        return self._sim_ns is not None

    def use_ros_time(self) -> None:
        with self._changed:
            self._sim_ns = 0

    def set_ros_time(self, nanoseconds: int) -> None:
        """A /clock message arrived (with `use_sim_time` only)."""
        with self._changed:
            self._sim_ns, self._ticks = nanoseconds, self._ticks + 1
            self._changed.notify_all()

    def now(self) -> Time:
        sim = self._sim_ns
        return Time(nanoseconds=time.time_ns() if sim is None else sim)

    def next_tick(self, seen: int, stop: threading.Event, poll_s: float = 0.1) -> tuple[int, int] | None:
        """(ROS time.) Block until a /clock message after the ``seen``-th arrives: (its number, the
        time); None once ``stop`` is set."""
        with self._changed:
            while not stop.is_set():
                if self._ticks != seen:
                    return self._ticks, self._sim_ns or 0
                self._changed.wait(poll_s)
        return None


# ---------------------------------------------------------------- parameters
@dataclass
class Parameter:
    name: str
    value: Any


# ------------------------------------------------------------- QoS and types
@dataclass(frozen=True)
class QoSProfile:
    """The QoS knobs the embedded backend honours (depth, reliability, durability)."""

    depth: int = 10
    reliable: bool = True
    transient_local: bool = False

    def token(self) -> str:
        return graph.qos_keyexpr(self.reliable, self.transient_local, self.depth)


def _qos(qos: Any) -> QoSProfile:
    if isinstance(qos, QoSProfile):
        return qos
    if isinstance(qos, int):
        return QoSProfile(depth=qos)
    raise TypeError(f"qos must be an int depth or a QoSProfile, got {qos!r}")


def type_name_of(cls_or_name: Any, attr: str = "__msgtype__") -> str:
    if isinstance(cls_or_name, str):
        return cls_or_name
    name = getattr(cls_or_name, attr, None)
    if name is None:
        raise InterfaceError(f"{cls_or_name!r} is not a message/service/action type of this runtime")
    return name


class ServiceClass:
    """What `runtime.service(name)` returns: `.Request` and `.Response` classes."""

    def __init__(self, name: str) -> None:
        srv = registry().service(name)
        self.__srvtype__ = srv.name
        self.Request = registry().message_class(srv.request)
        self.Response = registry().message_class(srv.response)


class ActionClass:
    """What `runtime.action(name)` returns: `.Goal`, `.Result`, `.Feedback`."""

    def __init__(self, name: str) -> None:
        act = registry().action(name)
        self.__actiontype__ = act.name
        self.spec = act
        self.Goal = registry().message_class(act.goal)
        self.Result = registry().message_class(act.result)
        self.Feedback = registry().message_class(act.feedback)


# ----------------------------------------------------------------- endpoints
class _Endpoint:
    """Shared parts: graph token, data key expression, attachment bookkeeping."""

    def __init__(self, node: Node, kind: graph.EntityKind, name: str, ros_type: str, qos: QoSProfile) -> None:
        self.node = node
        self.name = name
        self.ros_type = ros_type
        self.type_hash = registry().type_hash(ros_type)
        self.key = graph.data_key(node.context.domain_id, name, ros_type, self.type_hash)
        self.gid = uuid.uuid4().bytes
        self._seq = itertools.count(1)
        self._entity = graph.EndpointEntity(
            node=node.entity, entity_id=node.context.next_id(), kind=kind, name=name,
            dds_type_name=graph.ros2_to_dds_type(ros_type), type_hash=self.type_hash, qos=qos.token(),
        )
        self._token = None

    def _announce(self) -> None:
        """Declare the graph token, after the data endpoint exists (so a peer that sees it can use it)."""
        self._token = self.node.context.session.liveliness().declare_token(
            graph.endpoint_liveliness_keyexpr(self._entity)
        )

    def attachment(self, seq: int | None = None, gid: bytes | None = None) -> bytes:
        seq = next(self._seq) if seq is None else seq
        return graph.Attachment(seq, time.time_ns(), gid or self.gid).to_bytes()

    def destroy(self) -> None:
        if self._token is not None:
            self._token.undeclare()


class Publisher(_Endpoint):
    """With a `link`, each message leaves through that emulated link (stamped when published, put on arrival)."""

    def __init__(self, node: Node, ros_type: str, topic: str, qos: QoSProfile, link: Link | None = None) -> None:
        super().__init__(node, graph.EntityKind.PUBLISHER, topic, ros_type, qos)
        congestion = zenoh.CongestionControl.BLOCK if qos.reliable else zenoh.CongestionControl.DROP
        if qos.transient_local:  # the last `depth` messages stay in a cache late subscribers query
            self._pub = zenoh.ext.declare_advanced_publisher(
                node.context.session, self.key, congestion_control=congestion,
                cache=zenoh.ext.CacheConfig(max_samples=qos.depth), publisher_detection=True)
        else:
            self._pub = node.context.session.declare_publisher(self.key, congestion_control=congestion)
        # Zenoh's publisher refuses to be undeclared while another thread is in its put ("Already
        # borrowed"): a server destroyed while its executor publishes a status. One at a time.
        self._in_use = threading.Lock()
        self.topic_name = topic
        self.link = link
        self._announce()

    def wait_for_subscribers(self, timeout_sec: float) -> bool:
        """True once Zenoh routes this publisher to at least one subscriber."""
        deadline = time.monotonic() + timeout_sec
        advanced = not hasattr(self._pub, "matching_status")  # an AdvancedPublisher has none: ask the graph
        while not (self.get_subscription_count() if advanced else self._pub.matching_status.matching):
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.02)
        return True

    def publish(self, msg: Any) -> None:
        if getattr(msg, "__msgtype__", None) != self.ros_type:
            raise TypeError(f"{self.topic_name} carries {self.ros_type}, not {getattr(msg, '__msgtype__', type(msg))}")
        self.publish_raw(registry().serialize(msg, self.ros_type))

    def publish_raw(self, data: bytes) -> None:
        """Publish already-serialized CDR bytes (bag playback)."""
        attachment = self.attachment()
        if self.link is None:
            self._put(data, attachment)
        else:
            self.link.send(data, len(data), lambda payload: self._put(payload, attachment))

    def _put(self, payload: bytes, attachment: bytes) -> None:
        with self._in_use:
            self._pub.put(payload, attachment=attachment)

    def get_subscription_count(self) -> int:
        return sum(1 for e in self.node.graph() if e.kind == "MS" and e.name == self.topic_name)

    def destroy(self) -> None:
        with self._in_use:
            self._pub.undeclare()
        super().destroy()


def takes_message_info(callback: Callable) -> bool:
    """rclpy's rule: a subscription callback that takes two parameters, and not one, gets (message,
    message info)."""
    try:
        signature = inspect.signature(callback)
    except (TypeError, ValueError):  # nothing to read (a builtin): the message alone
        return False
    for params, answer in (((object(),), False), ((object(), object()), True)):
        try:
            signature.bind(*params)
            return answer
        except TypeError:
            pass
    return False


def message_info(attachment: zenoh.ZBytes | None, received_ns: int) -> dict:
    """rclpy's message info (a dict) of a sample with rmw_zenoh's attachment (sequence number, source
    timestamp, the publisher's gid), and ``publisher_gid``, which rclpy Jazzy leaves out (runtime docs);
    a sample without one (a plain Zenoh put) has no gid (b""), source timestamp (0) or number (None)."""
    try:
        sent = graph.Attachment.from_bytes(attachment.to_bytes()) if attachment is not None else None
    except ValueError:  # malformed: treated as none
        sent = None
    return {"source_timestamp": sent.timestamp_ns if sent else 0, "received_timestamp": received_ns,
            "publication_sequence_number": sent.sequence_id if sent else None, "reception_sequence_number": None,
            "publisher_gid": bytes(sent.gid) if sent else b""}


class Subscription(_Endpoint):
    """Receives every type/hash on the topic so that mismatches are reported, not silent.

    With raw=True the callback gets (topic, type, CDR bytes, receive time ns)
    on Zenoh's thread (it must be thread-safe and quick); otherwise it gets
    the message, in the executor, and, if it takes two parameters (rclpy's
    rule), the message info too (:func:`message_info`: the sender's gid).
    """

    def __init__(self, node: Node, ros_type: str, topic: str, callback: Callable, qos: QoSProfile, raw: bool = False) -> None:
        super().__init__(node, graph.EntityKind.SUBSCRIPTION, topic, ros_type, qos)
        self.topic_name = topic
        self._callback = callback
        self._raw = raw
        self._with_info = not raw and takes_message_info(callback)
        self.malformed = 0
        any_type = f"{node.context.domain_id}/{topic.lstrip('/')}/*/*"
        if qos.transient_local:  # first the publishers' cached messages, then live ones
            self._sub = zenoh.ext.declare_advanced_subscriber(
                node.context.session, any_type, self._on_sample, subscriber_detection=True,
                history=zenoh.ext.HistoryConfig(detect_late_publishers=True, max_samples=qos.depth))
        else:
            self._sub = node.context.session.declare_subscriber(any_type, self._on_sample)
        self._announce()

    def _on_sample(self, sample: zenoh.Sample) -> None:
        received = time.time_ns()
        key = str(sample.key_expr)
        data = sample.payload.to_bytes()
        if key != self.key:
            _prefix, dds_type, type_hash = key.rsplit("/", 2)
            self.node.get_logger().error(
                f"dropped a message on {self.topic_name}: it was published as {graph.dds_to_ros_type(dds_type)} "
                f"({type_hash}), this subscription expects {self.ros_type} ({self.type_hash})"
            )
            return
        if self._raw:  # recorders: called right here, on Zenoh's thread, in arrival order
            try:
                self._callback(self.topic_name, self.ros_type, data, time.time_ns())
            except Exception as exc:
                self.node.get_logger().error(f"raw callback on {self.topic_name} failed: {exc!r}")
            return
        try:
            msg = registry().deserialize(data, self.ros_type)
        except Exception as exc:  # rosbags raises assorted errors on bad bytes
            self.malformed += 1
            note = flood_note(self.malformed)
            if note is not None:
                self.node.get_logger().error(f"dropped a malformed message on {self.topic_name} (type "
                                             f"{self.ros_type}, {len(data)} bytes): {exc}{note}")
            return
        if self._with_info:
            self.node.context.post(self._callback, msg, message_info(sample.attachment, received))
        else:
            self.node.context.post(self._callback, msg)

    def destroy(self) -> None:
        self._sub.undeclare()
        super().destroy()


class Service(_Endpoint):
    def __init__(self, node: Node, srv_name: str, name: str, callback: Callable, qos: QoSProfile) -> None:
        super().__init__(node, graph.EntityKind.SERVICE, name, srv_name, qos)
        self.srv = registry().service(srv_name)
        self._callback = callback
        self._queryable = node.context.session.declare_queryable(self.key, self._on_query, complete=True)
        self._announce()

    def _on_query(self, query: zenoh.Query) -> None:
        try:
            request = registry().deserialize(query.payload.to_bytes(), self.srv.request)
            att = graph.Attachment.from_bytes(query.attachment.to_bytes())
        except Exception as exc:
            self.node.get_logger().error(f"rejected a malformed request on service {self.name} ({self.srv.name}): {exc}")
            query.reply_err(f"malformed request: {exc}".encode())
            return
        self.node.context.post(self._serve, query, request, att)

    def _serve(self, query: zenoh.Query, request: Any, att: graph.Attachment) -> None:
        """Run the callback; a callback may return a Future to answer later (action results)."""
        try:
            response = self._callback(request, registry().new(self.srv.response))
        except Exception as exc:
            self.node.get_logger().error(f"service {self.name} failed: {exc!r}")
            query.reply_err(f"service failed: {exc}".encode())
            return
        if isinstance(response, Future):
            response.add_done_callback(lambda f: self._reply(query, att, f.result()))
        else:
            self._reply(query, att, response)

    def _reply(self, query: zenoh.Query, att: graph.Attachment, response: Any) -> None:
        try:
            payload = registry().serialize(response, self.srv.response)
            query.reply(self.key, payload, attachment=self.attachment(att.sequence_id, att.gid))
        except Exception as exc:
            self.node.get_logger().error(f"service {self.name} could not send its response: {exc!r}")
        finally:
            query.drop()

    def destroy(self) -> None:
        self._queryable.undeclare()
        super().destroy()


class Client(_Endpoint):
    def __init__(self, node: Node, srv_name: str, name: str, qos: QoSProfile) -> None:
        super().__init__(node, graph.EntityKind.CLIENT, name, srv_name, qos)
        self.srv = registry().service(srv_name)
        self.srv_name = name
        self._announce()
        self._pending: list[tuple[Future, BaseException]] = []  # futures to fail when the servers leave
        self._unlisten: Callable[[], None] | None = None
        self._pending_lock = threading.Lock()

    def fail_when_servers_leave(self, future: Future, exc: BaseException) -> None:
        """Fail `future` with `exc` if, before it is done, a server of this service leaves the graph
        and none is left (its token deleted: see GraphCache; a killed server's goes at once)."""
        with self._pending_lock:
            self._pending = [(f, e) for f, e in self._pending if not f.done()] + [(future, exc)]
            if self._unlisten is None:
                self._unlisten = self.node.context.graph.listen(self._on_token)

    def _on_token(self, entry: graph.GraphEntry, alive: bool) -> None:
        if alive or entry.kind != "SS" or entry.name != self.srv_name:
            return
        if self._served_in(self.node.context.graph.entries()):
            return  # another server of it is still there
        with self._pending_lock:
            pending, self._pending = self._pending, []
        for future, exc in pending:
            future.set_exception(exc)

    def _served_in(self, entries: list[graph.GraphEntry]) -> bool:
        return any(e.kind == "SS" and e.name == self.srv_name for e in entries)

    def service_is_ready(self) -> bool:
        return self._served_in(self.node.graph())

    def wait_for_service(self, timeout_sec: float | None = None) -> bool:
        deadline = None if timeout_sec is None else time.monotonic() + timeout_sec
        while not self.service_is_ready():
            if deadline is not None and time.monotonic() >= deadline:
                return False
            time.sleep(0.05)
        return True

    def call_async(self, request: Any, timeout_sec: float = 10.0) -> Future:
        """Send a request; the future fails with ServiceTimeoutError when no server answers in time."""
        future = Future()
        payload = registry().serialize(request, self.srv.request)

        def worker() -> None:
            try:
                replies = self.node.context.session.get(
                    self.key, payload=payload, attachment=self.attachment(),
                    target=zenoh.QueryTarget.ALL_COMPLETE, consolidation=zenoh.ConsolidationMode.NONE,
                    timeout=timeout_sec,
                )
                for reply in replies:
                    if reply.ok is not None:
                        future.set_result(registry().deserialize(reply.ok.payload.to_bytes(), self.srv.response))
                        return
                    future.set_exception(RuntimeError(f"service {self.srv_name} failed: {reply.err.payload.to_bytes().decode(errors='replace')}"))
                    return
                future.set_exception(ServiceTimeoutError(
                    f"no server answered service {self.srv_name} ({self.srv.name}) within {timeout_sec:g} s"
                ))
            except Exception as exc:  # session closed under us, bad reply bytes
                future.set_exception(exc)

        threading.Thread(target=worker, name=f"call {self.srv_name}", daemon=True).start()
        return future

    def call(self, request: Any, timeout_sec: float = 10.0) -> Any:
        """Blocking call; raises ServiceTimeoutError when no server answers in time."""
        return self.call_async(request, timeout_sec).result(timeout_sec + 5.0)

    def destroy(self) -> None:
        with self._pending_lock:
            unlisten, self._unlisten = self._unlisten, None
        if unlisten is not None:
            unlisten()
        super().destroy()


class Timer:
    def __init__(self, node: Node, period_sec: float, callback: Callable) -> None:
        if not 0 < period_sec < float("inf"):  # NaN fails too
            raise ValueError(f"timer period must be a finite number > 0, got {period_sec}")
        self._stop = threading.Event()
        self._period = period_sec
        self._callback = callback
        self._context = node.context
        self._clock = node.get_clock()
        self._thread = threading.Thread(target=self._run, daemon=True, name="timer")
        self._thread.start()

    def _run(self) -> None:
        if self._clock.ros_time_is_active:
            self._run_on_ros_time()
            return
        next_time = time.monotonic() + self._period
        while not self._stop.wait(max(0.0, next_time - time.monotonic())):
            if not self._context.ok():
                return
            self._context.post(self._callback)
            next_time += self._period

    def _run_on_ros_time(self) -> None:
        """`use_sim_time`: due every period of /clock's time, as rclpy's timers on a ROS-time clock:
        periods that a jump forward skips are not made up, and a jump backwards (a bag played again)
        starts the period again from then."""
        period_ns = round(self._period * 1e9)
        seen, last = 0, self._clock.now().nanoseconds
        due = last + period_ns
        while (tick := self._clock.next_tick(seen, self._stop)) is not None:
            if not self._context.ok():
                return
            seen, now = tick
            if now < last:
                due = now + period_ns
            elif now >= due:
                self._context.post(self._callback)
                due = due + period_ns if now < due + period_ns else now + period_ns
            last = now

    def cancel(self) -> None:
        self._stop.set()

    destroy = cancel


# ----------------------------------------------------------------------- node
class Node:
    """A ROS 2 node on the embedded backend (the rclpy.node.Node methods we use).

    What the runtime keeps per node, with defaults (runtime/ros.py's Node declares the same):

    - ``single_threaded``: a node class sets it true for rclpy's single-threaded executor; no
      effect here, where callbacks run one at a time and every goal on a thread of its own;
    - ``goal_threads``: how many goals its action servers may run at once (each ActionServer adds
      its ``max_goals``; rclpy's executor gets that many threads more, here it is only counted);
    - ``emulated_links``: its topics' emulated links (runtime/link.py), made from its
      `link_emulation` parameters when it is built; every publisher on such a topic goes through
      its link;
    - ``use_sim_time`` (parameter, false): true puts the node's clock and timers on ROS time from
      /clock (rclpy's TimeSource; `edge-llm-ros bag play --clock` publishes it).
    """

    single_threaded: bool = False
    goal_threads: int = 0
    emulated_links: NodeLinks

    def __init__(self, node_name: str, *, namespace: str | None = None, context: Context | None = None,
                 parameter_overrides: dict[str, Any] | None = None) -> None:
        self.context = context or get_context()
        args = self.context.ros_args
        self._name, self._namespace = args.node_identity(node_name, namespace or "/")
        logger_name = self.get_fully_qualified_name().lstrip("/").replace("/", ".")
        self._logger = Logger(logger_name, args.log_levels.get(logger_name) or args.log_level or "info")
        self._overrides: dict[str, Any] = args.parameters(self.get_fully_qualified_name())
        self._overrides.update(parameter_overrides or {})
        self._parameters: dict[str, Parameter] = {}
        self.emulated_links = NodeLinks(parse_link_params(self._overrides), self.resolve_topic_name, self._logger)
        for name, value in self._overrides.items():
            if name.startswith("link_emulation."):
                self._parameters[name] = Parameter(name, value)
        self.entity = graph.NodeEntity(
            domain_id=self.context.domain_id, session_id=self.context.zid, node_id=self.context.next_id(),
            node_name=self._name, namespace=self._namespace,
        )
        self._token = self.context.session.liveliness().declare_token(graph.node_liveliness_keyexpr(self.entity))
        self._entities: list[Any] = []
        self._clock = Clock()
        if self.declare_parameter("use_sim_time", False).value:  # rclpy's TimeSource, on every node
            self._clock.use_ros_time()
            self.create_subscription(registry().message_class("rosgraph_msgs/msg/Clock"), CLOCK_TOPIC,
                                     self._on_clock, QoSProfile(depth=1, reliable=False))

    def _on_clock(self, msg: Any) -> None:
        self._clock.set_ros_time(msg.clock.sec * 1_000_000_000 + msg.clock.nanosec)

    # identity
    def get_name(self) -> str:
        return self._name

    def get_namespace(self) -> str:
        return self._namespace

    def get_fully_qualified_name(self) -> str:
        return f"{self._namespace.rstrip('/')}/{self._name}"

    def get_logger(self) -> Logger:
        return self._logger

    def get_clock(self) -> Clock:
        return self._clock

    def resolve_topic_name(self, name: str, *, only_expand: bool = False) -> str:
        """rclpy's Node.resolve_topic_name: the name expanded (namespace, ~) and, unless only_expand, remapped."""
        return resolve_name(name, self._namespace, self._name, None if only_expand else self.context.ros_args.remaps)

    # parameters
    def declare_parameter(self, name: str, default_value: Any = None, descriptor: Any = None,
                          ignore_override: bool = False) -> Parameter:
        """rclpy's signature. The descriptor is not kept: this backend serves no parameter services,
        so nothing can describe or change a parameter after start (nodes/parameters.py checks the
        ranges itself)."""
        value = default_value if ignore_override else self._overrides.get(name, default_value)
        if default_value is not None and value is not None and type(value) is not type(default_value):
            if isinstance(default_value, float) and isinstance(value, int) and not isinstance(value, bool):
                value = float(value)
            else:
                raise ParameterError(
                    f"parameter '{name}' of {self.get_fully_qualified_name()} must be "
                    f"{type(default_value).__name__}, got {value!r}"
                )
        param = Parameter(name, value)
        self._parameters[name] = param
        return param

    def declare_parameters(self, namespace: str, parameters: list[tuple[str, Any]]) -> list[Parameter]:
        prefix = f"{namespace}." if namespace else ""
        return [self.declare_parameter(prefix + name, value) for name, value in parameters]

    def get_parameter(self, name: str) -> Parameter:
        if name not in self._parameters:
            raise ParameterError(f"parameter '{name}' is not declared on {self.get_fully_qualified_name()}")
        return self._parameters[name]

    def has_parameter(self, name: str) -> bool:
        return name in self._parameters

    # endpoints
    def _keep(self, entity: Any) -> Any:
        self._entities.append(entity)
        return entity

    def create_publisher(self, msg_type: Any, topic: str, qos: Any = 10) -> Publisher:
        name = registry().check_message(type_name_of(msg_type))
        resolved = self.resolve_topic_name(topic)
        return self._keep(Publisher(self, name, resolved, _qos(qos), link=self.emulated_links.get(resolved)))

    def create_subscription(self, msg_type: Any, topic: str, callback: Callable, qos: Any = 10, *, raw: bool = False) -> Subscription:
        name = registry().check_message(type_name_of(msg_type))
        return self._keep(Subscription(self, name, self.resolve_topic_name(topic), callback, _qos(qos), raw=raw))

    def create_service(self, srv_type: Any, name: str, callback: Callable, qos: Any = 10) -> Service:
        return self._keep(Service(self, type_name_of(srv_type, "__srvtype__"), self.resolve_topic_name(name), callback, _qos(qos)))

    def create_client(self, srv_type: Any, name: str, qos: Any = 10) -> Client:
        return self._keep(Client(self, type_name_of(srv_type, "__srvtype__"), self.resolve_topic_name(name), _qos(qos)))

    def create_timer(self, period_sec: float, callback: Callable) -> Timer:
        return self._keep(Timer(self, period_sec, callback))

    # graph
    def graph(self, timeout: float = 2.0) -> list[graph.GraphEntry]:
        """All liveliness tokens currently in the system, parsed (the context's GraphCache).

        Until the cache is complete it may hold only this process's own
        tokens, or some of the others (its history comes one token at a
        time): the router is asked for all at once, again until its answer
        holds another session's token or `timeout` after the session's start
        has passed (an otherwise empty system). Only the answer counts, never
        what the history has brought so far: CI once saw `topic info` find the
        node but not its topic. From then on the cache answers at once.
        However late the first call comes (a loaded machine can spend the whole
        window importing), it asks for GRAPH_LATE_WINDOW_S more, each query
        waiting for the answer: a query returns as soon as the router has
        replied (an empty answer at once, while the session's routes are not
        yet in place), so only an empty system, or a router that never
        answers, costs the window or the floor.
        """
        cache, zid = self.context.graph, self.context.zid
        deadline = max(cache.started + timeout, time.monotonic() + GRAPH_LATE_WINDOW_S)
        while not cache.complete:
            answer = cache.query(max(GRAPH_QUERY_FLOOR_S, deadline - time.monotonic()))
            if any(e.zid != zid for e in answer) or time.monotonic() >= deadline:
                cache.complete = True
            else:
                time.sleep(0.05)
        return cache.entries()

    def get_node_names_and_namespaces(self) -> list[tuple[str, str]]:
        return sorted({(e.node_name, e.node_namespace) for e in self.graph() if e.kind == "NN"})

    def get_topic_names_and_types(self) -> list[tuple[str, list[str]]]:
        return _names_and_types(e for e in self.graph() if e.kind in ("MP", "MS"))

    def get_service_names_and_types(self) -> list[tuple[str, list[str]]]:
        return _names_and_types(e for e in self.graph() if e.kind in ("SS", "SC"))

    def count_publishers(self, topic: str) -> int:
        topic = self.resolve_topic_name(topic)
        return sum(1 for e in self.graph() if e.kind == "MP" and e.name == topic)

    def count_subscribers(self, topic: str) -> int:
        topic = self.resolve_topic_name(topic)
        return sum(1 for e in self.graph() if e.kind == "MS" and e.name == topic)

    def destroy_entity(self, entity: Any) -> bool:
        """Undeclare one publisher, subscription, service, client or timer of this node (rclpy's
        destroy_publisher, destroy_subscription, ... are this); False if it is not this node's."""
        if entity not in self._entities:
            return False
        self._entities.remove(entity)
        entity.destroy()
        return True

    destroy_publisher = destroy_subscription = destroy_service = destroy_client = destroy_timer = destroy_entity

    def destroy_node(self) -> None:
        self.emulated_links.close()  # first: no delivery may reach an undeclared publisher
        for entity in reversed(self._entities):
            try:
                entity.destroy()
            except zenoh.ZError:
                pass
        self._entities.clear()
        try:
            self._token.undeclare()
        except zenoh.ZError:
            pass


def publisher_gid(publisher: Publisher) -> bytes:
    """runtime.publisher_gid(): the gid this publisher's messages carry (their attachment's), as a
    subscription's message info names it."""
    return publisher.gid


def shaped(node: Node, publisher: Publisher, topic: str | None = None) -> Publisher:
    """runtime.shaped(): the publisher itself; this backend already routes configured topics through their link.

    Nodes call it so that the same line shapes their publisher under rclpy.
    """
    return publisher


def _names_and_types(entries: Any) -> list[tuple[str, list[str]]]:
    found: dict[str, set[str]] = {}
    for e in entries:
        found.setdefault(e.name, set()).add(e.ros_type)
    return sorted((name, sorted(types)) for name, types in found.items())


__all__ = [
    "CLOCK_TOPIC", "ActionClass", "Client", "Clock", "Context", "Future", "Logger", "Node", "Parameter", "ParameterError",
    "ParamsError", "Publisher", "QoSProfile", "Service", "ServiceClass", "ServiceTimeoutError", "Subscription", "Time",
    "Timer", "get_context", "shaped", "init", "ok", "shutdown", "spin", "spin_once", "spin_until_future_complete",
]
