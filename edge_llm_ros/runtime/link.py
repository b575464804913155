"""Link emulation: per-link one-way latency and bandwidth, applied to real messages in the sender.

`tc netem` is not available everywhere the edge-cloud experiments run, so the
runtime emulates the link between a robot and a server itself: a publisher
whose topic is on an emulated link hands each serialized message to a `Link`,
which delivers it to the wire later, as a real link would:

    departure = when the token bucket lets the message's bytes out  (serialization, queueing)
    arrival   = departure + one-way latency                         (propagation)
    deliver(payload) runs at `arrival`, on the link's own thread, in send order

The token bucket is the GCRA form (virtual scheduling, ITU-T I.371): with
rate r = bandwidth bytes/s and bucket B = burst_bytes, message i of S_i bytes
sent at t_i gets

    tat_i       = max(t_i, tat_{i-1}) + S_i / r     # when its last byte has left at rate r
    departure_i = max(t_i, tat_i - B / r)           # up to B bytes may leave ahead of the rate

With B = 0 (the default) every message waits its own serialization time
S*8/bandwidth and queues behind the ones before it, as on a wire, so
throughput never exceeds the bandwidth. Nothing is dropped and `send` never
blocks: the backlog is bounded only by memory, and a warning is logged when
it grows past `backlog_warn_s` seconds. Sizes are payload bytes (CDR), no
protocol headers.

The node-facing part is the `link_emulation` parameter group (see
`parse_link_params`) and `NodeLinks`, which owns a node's links. The
embedded backend routes every publisher on a configured topic through its
link; under rclpy a node wraps its publishers with `runtime.shaped(...)`.
This module imports neither ROS nor Zenoh.
"""

from __future__ import annotations

import collections
import logging
import math
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Callable

from edge_llm_ros.runtime.params import ParamsError

PARAM_PREFIX = "link_emulation"
LINK_KEYS = ("topics", "latency_ms", "bandwidth_mbps", "burst_bytes")
BACKLOG_WARN_S = 2.0

_log = logging.getLogger(__name__)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _fmt(value: float) -> str:
    """25 -> '25.0', 0.25 -> '0.25' (one decimal unless more are needed)."""
    return f"{value:.1f}" if value == round(value, 1) else f"{value:g}"


# ------------------------------------------------------------------- the spec
@dataclass(frozen=True)
class LinkSpec:
    """One direction of a link: one-way latency, bandwidth (inf = unlimited), token-bucket burst."""

    latency_ms: float = 0.0
    bandwidth_mbps: float = math.inf
    burst_bytes: int = 0

    def __post_init__(self) -> None:
        if not _number(self.latency_ms) or not math.isfinite(self.latency_ms) or self.latency_ms < 0:
            raise ValueError(f"latency_ms must be a finite number >= 0 (one-way delay in milliseconds), "
                             f"got {self.latency_ms!r}")
        if not _number(self.bandwidth_mbps) or math.isnan(self.bandwidth_mbps) or self.bandwidth_mbps <= 0:
            raise ValueError(f"bandwidth_mbps must be a number > 0 in Mbit/s (leave it out, or .inf, for "
                             f"unlimited), got {self.bandwidth_mbps!r}")
        if not isinstance(self.burst_bytes, int) or isinstance(self.burst_bytes, bool) or self.burst_bytes < 0:
            raise ValueError(f"burst_bytes must be an integer >= 0, got {self.burst_bytes!r}")
        if self.burst_bytes and math.isinf(self.bandwidth_mbps):
            raise ValueError(f"burst_bytes ({self.burst_bytes}) needs a finite bandwidth_mbps: "
                             "a burst only means something against a rate")

    @property
    def bytes_per_s(self) -> float:
        return self.bandwidth_mbps * 1e6 / 8

    @property
    def transparent(self) -> bool:
        """No latency and no rate limit: messages go out at once, in the caller's thread."""
        return self.latency_ms == 0 and math.isinf(self.bandwidth_mbps)

    def describe(self) -> str:
        """'25.0 ms one-way, 20.0 Mbit/s' (what logs and benchmark labels say)."""
        rate = "unlimited bandwidth" if math.isinf(self.bandwidth_mbps) else f"{_fmt(self.bandwidth_mbps)} Mbit/s"
        burst = f", burst {self.burst_bytes} B" if self.burst_bytes else ""
        return f"{_fmt(self.latency_ms)} ms one-way, {rate}{burst}"


# ------------------------------------------------------------ the token bucket
class TokenBucket:
    """GCRA token bucket: when each message may leave (pure arithmetic, times in seconds)."""

    def __init__(self, bytes_per_s: float, burst_bytes: int = 0) -> None:
        self.bytes_per_s = bytes_per_s
        self.burst_s = burst_bytes / bytes_per_s if math.isfinite(bytes_per_s) else 0.0
        self._tat = -math.inf  # theoretical arrival time: when the bytes so far have left at the rate

    def departure(self, now: float, size_bytes: int) -> float:
        if math.isinf(self.bytes_per_s):
            return now
        self._tat = max(now, self._tat) + size_bytes / self.bytes_per_s
        return max(now, self._tat - self.burst_s)


@dataclass(frozen=True)
class Schedule:
    """When one message was handed to the link, leaves it and arrives (time.monotonic() seconds)."""

    sent: float
    departure: float
    arrival: float

    @property
    def delay(self) -> float:
        return self.arrival - self.sent


@dataclass
class _Pending:
    payload: Any
    size: int
    deliver: Callable[[Any], None]
    schedule: Schedule


# ------------------------------------------------------------------- the link
class Link:
    """A shaper in front of a sender: messages are delivered after their serialization delay and latency.

    `send(payload, size_bytes, deliver)` returns at once with the message's
    Schedule; `deliver(payload)` runs on the link's delivery thread at the
    arrival time (not earlier; later only by thread wake-up), in send order.
    A transparent spec (no latency, no rate) delivers in the caller's thread
    before `send` returns and starts no thread.

    `close()` discards the messages still pending and returns how many (the
    sender is going away; a node shutting down does not wait out a backlog);
    `close(drain=True)` delivers them at their arrival times first. Either
    way the delivery thread has ended when close() returns.
    """

    def __init__(self, spec: LinkSpec, name: str = "link", *, warn: Callable[[str], None] | None = None,
                 backlog_warn_s: float = BACKLOG_WARN_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.spec = spec
        self.name = name
        self._warn = warn or _log.warning
        self._backlog_warn_s = backlog_warn_s
        self._backlog_warned = False
        self._clock = clock
        self._bucket = TokenBucket(spec.bytes_per_s, spec.burst_bytes)
        self._latency_s = spec.latency_ms / 1000
        self._queue: collections.deque[_Pending] = collections.deque()
        self._queued_bytes = 0
        self._cond = threading.Condition()
        self._closed = False
        self._drain = False
        self._thread: threading.Thread | None = None
        if not spec.transparent:
            self._thread = threading.Thread(target=self._run, name=f"link {name}", daemon=True)
            self._thread.start()

    @property
    def pending(self) -> int:
        with self._cond:
            return len(self._queue)

    def send(self, payload: Any, size_bytes: int | None, deliver: Callable[[Any], None]) -> Schedule:
        """Queue one message of `size_bytes` (len(payload) when None); never blocks, never drops."""
        size = len(payload) if size_bytes is None else int(size_bytes)
        if size < 0:
            raise ValueError(f"size_bytes must be >= 0, got {size_bytes}")
        with self._cond:
            if self._closed:
                raise RuntimeError(f"emulated link {self.name} is closed")
            now = self._clock()
            departure = self._bucket.departure(now, size)
            schedule = Schedule(now, departure, departure + self._latency_s)
            if self._thread is not None:
                self._queue.append(_Pending(payload, size, deliver, schedule))
                self._queued_bytes += size
                self._check_backlog(departure - now)
                self._cond.notify()
        if self._thread is None:
            deliver(payload)
        return schedule

    def _check_backlog(self, backlog_s: float) -> None:
        """Warn once when the sender outruns the link by more than backlog_warn_s; re-arm below half of it."""
        if backlog_s > self._backlog_warn_s and not self._backlog_warned:
            self._backlog_warned = True
            self._warn(f"emulated link {self.name}: {backlog_s:.1f} s of backlog ({len(self._queue)} messages, "
                       f"{self._queued_bytes / 1e6:.1f} MB) queued behind {_fmt(self.spec.bandwidth_mbps)} Mbit/s; "
                       "the publisher sends faster than the link carries (nothing is dropped)")
        elif backlog_s < self._backlog_warn_s / 2:
            self._backlog_warned = False

    def _next(self) -> _Pending | None:
        """The head message once its arrival time has come; None when the link is closed and done."""
        with self._cond:
            while True:
                if self._closed and not (self._drain and self._queue):
                    return None
                if not self._queue:
                    self._cond.wait()
                    continue
                wait = self._queue[0].schedule.arrival - self._clock()
                if wait <= 0:
                    item = self._queue.popleft()
                    self._queued_bytes -= item.size
                    return item
                self._cond.wait(wait)

    def _run(self) -> None:
        while (item := self._next()) is not None:
            try:
                item.deliver(item.payload)
            except Exception as exc:  # a sender gone under us must not end the link thread
                self._warn(f"emulated link {self.name}: delivery failed: {exc!r}")

    def close(self, drain: bool = False, timeout: float | None = None) -> int:
        """Stop the link: discard pending messages (or deliver them, drain=True); returns the number discarded."""
        with self._cond:
            self._closed = True
            self._drain = drain
            discarded = 0 if drain else len(self._queue)
            if not drain:
                self._queue.clear()
                self._queued_bytes = 0
            self._cond.notify_all()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            if timeout is None and drain:
                with self._cond:
                    last = self._queue[-1].schedule.arrival if self._queue else self._clock()
                timeout = max(0.0, last - self._clock()) + 10.0
            thread.join(10.0 if timeout is None else timeout)
            if thread.is_alive():
                self._warn(f"emulated link {self.name}: delivery thread still busy after close")
        return discarded


# ------------------------------------------------------------ node parameters
@dataclass(frozen=True)
class LinkConfig:
    """One `link_emulation.<name>` entry: a link and the topics (as written, unresolved) it carries."""

    name: str
    spec: LinkSpec
    topics: tuple[str, ...]


def parse_link_params(params: Mapping[str, Any], prefix: str = PARAM_PREFIX) -> list[LinkConfig]:
    """The links a node's flat (dotted) parameters describe; ParamsError naming the parameter otherwise.

    Layout (ROS 2 params YAML, nav2's plugin-list convention, since topic
    names with '/' cannot be parameter names and rclpy needs the names to
    declare):

        link_emulation:
          links: [uplink]                 # names of the links below
          uplink:
            topics: [draft, prune]        # resolved like the node's own topic names
            latency_ms: 25.0              # one-way, default 0
            bandwidth_mbps: 20.0          # default unlimited
            burst_bytes: 0                # token bucket depth, default 0
    """
    mine = {k: v for k, v in params.items() if k == prefix or k.startswith(prefix + ".")}
    if not mine:
        return []
    links_key = f"{prefix}.links"
    names = mine.get(links_key, [])
    if not isinstance(names, list) or not all(isinstance(n, str) and n for n in names):
        raise ParamsError(f"parameter {links_key} must be a list of link names, got {names!r}")
    if len(set(names)) != len(names):
        raise ParamsError(f"parameter {links_key} names a link twice: {names!r}")
    for key in sorted(mine):
        if key == links_key:
            continue
        link, _, field = key[len(prefix) + 1:].partition(".")
        if not field or link not in names:
            raise ParamsError(f"parameter {key}: '{link}' is not a link named in {links_key} {names!r} "
                              f"(each link has {', '.join(LINK_KEYS)})")
        if field not in LINK_KEYS:
            raise ParamsError(f"parameter {key}: unknown link setting '{field}' (known: {', '.join(LINK_KEYS)})")
    configs = []
    for name in names:
        where = f"{prefix}.{name}."
        topics = mine.get(where + "topics")
        if not isinstance(topics, list) or not topics or not all(isinstance(t, str) and t for t in topics):
            raise ParamsError(f"parameter {where}topics must be a non-empty list of topic names, got {topics!r}")
        values = {f: mine[where + f] for f in ("latency_ms", "bandwidth_mbps", "burst_bytes") if where + f in mine}
        try:
            spec = LinkSpec(**values)
        except ValueError as exc:
            raise ParamsError(f"parameter {where}{exc}") from None
        configs.append(LinkConfig(name, spec, tuple(topics)))
    return configs


class NodeLinks:
    """A node's emulated links, by resolved topic name; logs one INFO line per shaped topic.

    Topics on one link share its bandwidth and its queue (an uplink carries
    the draft and prune messages one after the other).
    """

    def __init__(self, configs: list[LinkConfig], resolve: Callable[[str], str], logger: Any) -> None:
        self._by_topic: dict[str, Link] = {}
        self._links: list[Link] = []
        self._logger = logger
        for config in configs:
            resolved = [resolve(t) for t in config.topics]
            for topic in resolved:
                if topic in self._by_topic:
                    raise ParamsError(f"parameter {PARAM_PREFIX}.{config.name}.topics: {topic} is already "
                                      f"on link {self._by_topic[topic].name}")
            link = Link(config.spec, config.name, warn=logger.warning)
            self._links.append(link)
            for topic in resolved:
                self._by_topic[topic] = link
                logger.info(f"emulated link on {topic}: {config.spec.describe()}")

    def __bool__(self) -> bool:
        return bool(self._by_topic)

    def get(self, topic: str) -> Link | None:
        return self._by_topic.get(topic)

    def close(self) -> None:
        """Close every link, discarding what is still queued (logged when there was any)."""
        for link in self._links:
            discarded = link.close()
            if discarded:
                self._logger.info(f"emulated link {link.name}: discarded {discarded} undelivered messages on shutdown")
        self._links.clear()
        self._by_topic.clear()


# ------------------------------------------------------------ any publisher
class ShapedPublisher:
    """Wraps any publisher with `.publish(msg)`: each message goes out through `link` after its delay.

    `size_of(msg)` gives the bytes the link charges (the serialized size).
    Every other attribute is the wrapped publisher's.
    """

    def __init__(self, publisher: Any, link: Link, size_of: Callable[[Any], int]) -> None:
        self._publisher = publisher
        self._size_of = size_of
        self.link = link

    def publish(self, msg: Any) -> Schedule:
        return self.link.send(msg, self._size_of(msg), self._publisher.publish)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._publisher, name)


def rclpy_shaped(node: Any, publisher: Any, topic: str | None = None) -> Any:  # pragma: no cover - runs in node processes
    """runtime.shaped() under rclpy: `publisher` wrapped in its topic's link, or itself when none is configured.

    ``node``: a runtime.ros.Node. Reads its `link_emulation` parameters (declaring them on first use)
    into its ``emulated_links``, and charges each message its size from rclpy.serialization.serialize_message.
    The links live as long as the node's process (daemon threads).
    Tested under rclpy by test_edge_cloud_nodes (draft_node and verifier_node on
    config/edge_cloud.yaml's links, [rclpy] cases), the link itself by test_link.
    Write the YAML floats as floats (25.0): rclpy parameters are statically typed.
    """
    from rclpy.exceptions import ParameterUninitializedException
    from rclpy.parameter import Parameter
    from rclpy.serialization import serialize_message

    links = node.emulated_links
    if links is None:
        def value(name: str, kind: Any) -> Any:
            if not node.has_parameter(name):
                node.declare_parameter(name, kind)
            try:
                return node.get_parameter(name).value
            except ParameterUninitializedException:
                return None

        flat: dict[str, Any] = {}
        names = value(f"{PARAM_PREFIX}.links", Parameter.Type.STRING_ARRAY) or []
        if names:
            flat[f"{PARAM_PREFIX}.links"] = list(names)
        kinds = {"topics": Parameter.Type.STRING_ARRAY, "latency_ms": Parameter.Type.DOUBLE,
                 "bandwidth_mbps": Parameter.Type.DOUBLE, "burst_bytes": Parameter.Type.INTEGER}
        for name in names:
            for field, kind in kinds.items():
                v = value(f"{PARAM_PREFIX}.{name}.{field}", kind)
                if v is not None:
                    flat[f"{PARAM_PREFIX}.{name}.{field}"] = list(v) if field == "topics" else v
        links = NodeLinks(parse_link_params(flat), node.resolve_topic_name, node.get_logger())
        node.emulated_links = links
    link = links.get(node.resolve_topic_name(topic or publisher.topic_name))
    if link is None:
        return publisher
    return ShapedPublisher(publisher, link, lambda msg: len(serialize_message(msg)))


__all__ = [
    "BACKLOG_WARN_S", "Link", "LinkConfig", "LinkSpec", "NodeLinks", "PARAM_PREFIX", "Schedule", "ShapedPublisher",
    "TokenBucket", "parse_link_params", "rclpy_shaped",
]
