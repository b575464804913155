"""foxglove_bridge_node: the ROS graph on Foxglove's WebSocket protocol, through foxglove-sdk's server.

Every topic of the graph becomes a channel (checked every `topic_refresh_s`; a topic that leaves
the graph closes its channel; hidden ones, such as an action's /_action/ topics, are left out, as
`ros2 topic list` leaves them out): its schema is the type's definition in `ros2msg` encoding with its
dependencies, as rosbag2's MCAP writer stores it, and its messages are the CDR bytes as they
crossed the wire (`cdr` encoding). The node subscribes to a ROS topic only while some client
subscribes to its channel, with the durability its publishers offer (a latched topic such as
/edge_llm/plan reaches a client that subscribes late). Clients may publish (Foxglove's Publish
panel) on the topics in `client_topics` only, /edge_llm/instruction by default: an operator types an
instruction and the deployment answers on /edge_llm/response; a channel advertised on another
topic, or in another encoding than cdr, is refused with a warning to that client.

The server listens on `address`:`port` (127.0.0.1:8765 by default, the Foxglove app's default
connection; port 0 picks a free one, logged). foxglove-sdk 0.30 speaks the `foxglove.sdk.v1`
subprotocol (the frames of `foxglove.websocket.v1`). Every launch file starts this node with
`foxglove:=true` (`foxglove_port:=` sets the port). Under ROS 2, foxglove_bridge (the ROS package)
is the alternative; this node runs on both runtimes. Its status on /diagnostics counts channels,
subscribed channels, messages sent and client messages published or refused.
"""

from __future__ import annotations

import dataclasses
import queue
import threading
import time
from typing import Any

from edge_llm_ros import runtime as rt
from edge_llm_ros.nodes.common import run_node
from edge_llm_ros.nodes.diagnostics import OK, WARN, Increase, Status, Updater
from edge_llm_ros.nodes.parameters import declare, param

APPLY_S = 0.1  # subscription changes asked by clients are applied on the node's executor this often


@dataclasses.dataclass(frozen=True)
class FoxgloveParams:
    address: str = param("127.0.0.1", "address the WebSocket server binds (127.0.0.1: this machine only)")
    port: int = param(8765, "WebSocket port (0: any free one, logged)", low=0, high=65535)
    client_topics: str = param("/edge_llm/instruction", "topics Foxglove clients may publish on, comma-separated "
                                                        "('' = none)")
    topic_refresh_s: float = param(1.0, "seconds between looks at the graph for new and gone topics", low=0.05)

    @property
    def publishable(self) -> frozenset[str]:
        return frozenset(t.strip() for t in self.client_topics.split(",") if t.strip())


class FoxgloveBridgeNode(rt.Node):
    def __init__(self, **node_options) -> None:
        """``node_options``: rt.Node's (namespace, parameter_overrides: how tests start it in-process)."""
        import foxglove
        from foxglove.websocket import Capability

        super().__init__("foxglove_bridge", **{"namespace": "edge_llm", **node_options})
        self.params = p = declare(self, FoxgloveParams)
        self.lock = threading.Lock()
        self.channels: dict[str, Any] = {}  # topic -> foxglove Channel
        self.types: dict[str, str] = {}  # topic -> its type
        self.undescribed: set[str] = set()  # topics whose type this process cannot describe (logged once)
        self.subscribers: dict[str, int] = {}  # topic -> clients subscribed to its channel
        self.feeds: dict[str, Any] = {}  # topic -> the ROS subscription feeding its channel
        self.changes: queue.SimpleQueue = queue.SimpleQueue()  # topics whose subscription to revisit
        self.client_channels: dict[tuple[int, int], tuple[str, Any]] = {}  # (client, channel) -> (topic, publisher)
        self.counts = {"sent": 0, "published": 0, "refused": 0}
        self.refusals = Increase()  # client channels refused since the last status
        self.sink = foxglove.Context()  # this server's own: its channels reach no other sink
        self.server = foxglove.start_server(
            name=f"edge_llm_ros {self.get_fully_qualified_name()}", host=p.address, port=p.port,
            capabilities=[Capability.ClientPublish] if p.publishable else [], supported_encodings=["cdr"],
            server_listener=self, context=self.sink)
        self.create_timer(p.topic_refresh_s, self.refresh)
        self.create_timer(APPLY_S, self.apply)
        self.diagnostics = Updater(self, hardware_id=f"ws://{p.address}:{self.server.port}")
        self.diagnostics.add("bridge", self.diagnose)
        self.refresh()
        self.get_logger().info(f"Foxglove WebSocket server on ws://{p.address}:{self.server.port} "
                               f"(subprotocol foxglove.sdk.v1); clients may publish on "
                               f"{', '.join(sorted(p.publishable)) or 'no topic'}")

    # -- channels: the graph's topics ----------------------------------------------------------------

    def refresh(self) -> None:
        """Open a channel per new topic of the graph, close the channels of topics gone."""
        import foxglove

        from edge_llm_ros.runtime.interfaces import InterfaceError, registry

        graph = {name: types[0] for name, types in self.get_topic_names_and_types()
                 if len(types) == 1 and not hidden(name)}
        with self.lock:
            for topic in [t for t in self.channels if t not in graph]:
                self.channels.pop(topic).close()
                self.types.pop(topic, None)
            for topic, type_name in graph.items():
                if topic in self.channels:
                    continue
                try:
                    definition = registry().msgdef(type_name)
                except (InterfaceError, AssertionError, KeyError, ValueError) as exc:  # no channel, not a wrong one
                    if topic not in self.undescribed:
                        self.undescribed.add(topic)
                        self.get_logger().warning(f"{topic} ({type_name}) is not bridged: its definition is "
                                                  f"unknown here ({type(exc).__name__}: {exc})")
                    continue
                schema = foxglove.Schema(name=type_name, encoding="ros2msg", data=definition.encode())
                self.channels[topic] = foxglove.Channel(topic, schema=schema, message_encoding="cdr",
                                                        context=self.sink)
                self.types[topic] = type_name

    # -- foxglove's ServerListener (its threads): note what changed, the executor applies it -------------

    def on_subscribe(self, client, channel) -> None:
        with self.lock:
            self.subscribers[channel.topic] = self.subscribers.get(channel.topic, 0) + 1
        self.changes.put(channel.topic)

    def on_unsubscribe(self, client, channel) -> None:
        with self.lock:
            self.subscribers[channel.topic] = max(0, self.subscribers.get(channel.topic, 0) - 1)
        self.changes.put(channel.topic)

    def on_client_advertise(self, client, channel) -> None:
        allowed = self.params.publishable
        with self.lock:
            known = self.types.get(channel.topic)  # the type the graph has on that topic, if any
        if channel.topic not in allowed:
            why = f"publishing on {channel.topic} is not allowed (client_topics: {', '.join(sorted(allowed)) or 'none'})"
        elif channel.encoding != "cdr":
            why = f"encoding {channel.encoding!r} is not supported (cdr only)"
        elif known is not None and channel.schema_name != known:
            why = f"{channel.topic} carries {known}, not {channel.schema_name or 'an unnamed type'}"
        else:
            try:
                rt.message(channel.schema_name)  # a type this process can publish
            except (rt.InterfaceError, ValueError) as exc:
                why = f"unknown type {channel.schema_name!r} for {channel.topic}: {exc}"
            else:
                self.changes.put(("advertise", client.id, channel.id, channel.topic, channel.schema_name))
                return
        self.refuse(client, why)

    def on_client_unadvertise(self, client, client_channel_id: int) -> None:
        self.changes.put(("unadvertise", client.id, client_channel_id))

    def on_message_data(self, client, client_channel_id: int, data: bytes) -> None:
        from foxglove import StatusLevel

        with self.lock:
            found = self.client_channels.get((client.id, client_channel_id))
        if found is None:
            self.server.publish_status(f"channel {client_channel_id} is not advertised here (or was refused)",
                                       StatusLevel.Warning)
            return
        topic, publisher = found
        publish_raw(publisher, bytes(data))
        with self.lock:
            self.counts["published"] += 1

    def refuse(self, client, why: str) -> None:
        from foxglove import StatusLevel

        with self.lock:
            self.counts["refused"] += 1
        self.get_logger().warning(f"client {client.id}: {why}")
        self.server.publish_status(why, StatusLevel.Warning)

    # -- the executor: subscriptions and publishers ------------------------------------------------------

    def apply(self) -> None:
        """Subscribe to a topic while a client subscribes to its channel; publishers for client channels."""
        while True:
            try:
                change = self.changes.get_nowait()
            except queue.Empty:
                return
            if isinstance(change, str):
                self.resubscribe(change)
            elif change[0] == "advertise":
                _, client, channel, topic, type_name = change
                with self.lock:
                    self.client_channels[(client, channel)] = (topic, self.create_publisher(rt.message(type_name),
                                                                                            topic, 10))
            else:
                _, client, channel = change
                with self.lock:
                    gone = self.client_channels.pop((client, channel), None)
                if gone is not None:
                    self.destroy_publisher(gone[1])

    def resubscribe(self, topic: str) -> None:
        with self.lock:
            wanted = self.subscribers.get(topic, 0) > 0 and topic in self.channels
            held, type_name = self.feeds.get(topic), self.types.get(topic)
        if wanted and held is None:
            channel = self.channels[topic]

            def forward(data: bytes) -> None:
                channel.log(data, log_time=time.time_ns())
                with self.lock:
                    self.counts["sent"] += 1

            subscription = subscribe_raw(self, type_name, topic, self.qos_for(topic), forward)
            with self.lock:
                self.feeds[topic] = subscription
        elif not wanted and held is not None:
            with self.lock:
                self.feeds.pop(topic, None)
            self.destroy_subscription(held)

    def qos_for(self, topic: str) -> Any:
        """Transient local where the topic's publishers all offer it (so a latched message arrives)."""
        from edge_llm_ros.nodes.common import latched_qos

        if rt.BACKEND != "rclpy":  # a transient-local Zenoh subscriber also hears volatile publishers
            return latched_qos()
        from rclpy.qos import DurabilityPolicy

        offered = [i.qos_profile.durability for i in self.get_publishers_info_by_topic(topic)]
        if offered and all(d == DurabilityPolicy.TRANSIENT_LOCAL for d in offered):
            return latched_qos()
        return 10

    def diagnose(self, status: Status) -> None:
        with self.lock:
            counts, channels = dict(self.counts), len(self.channels)
            subscribed = sum(1 for n in self.subscribers.values() if n > 0)
            client_channels = len(self.client_channels)
        refused = self.refusals.since_last(counts["refused"])
        status.summary(OK, f"{channels} channels, {subscribed} subscribed")
        if refused:
            status.merge(WARN, f"{refused} client channel(s) refused in the last {self.diagnostics.period:g} s")
        for key, value in (("address", f"ws://{self.params.address}:{self.server.port}"), ("channels", channels),
                           ("subscribed channels", subscribed), ("messages sent", counts["sent"]),
                           ("client channels", client_channels), ("client messages published", counts["published"]),
                           ("client channels refused", counts["refused"])):
            status.add(key, value)

    def destroy_node(self) -> None:
        self.server.stop()
        super().destroy_node()


def hidden(topic: str) -> bool:
    """A hidden topic (a name token starting with '_', such as an action's /_action/feedback), which
    `ros2 topic list` leaves out too."""
    return any(token.startswith("_") for token in topic.split("/"))


def subscribe_raw(node, type_name: str, topic: str, qos, callback) -> Any:
    """A subscription handing ``callback`` each message's CDR bytes, on either runtime."""
    if rt.BACKEND == "rclpy":
        return node.create_subscription(rt.message(type_name), topic, lambda data: callback(bytes(data)), qos, raw=True)
    return node.create_subscription(type_name, topic, lambda _t, _ty, data, _ns: callback(bytes(data)), qos, raw=True)


def publish_raw(publisher, data: bytes) -> None:
    """Publish CDR bytes as they came (rclpy takes serialized bytes in publish)."""
    if rt.BACKEND == "rclpy":
        publisher.publish(data)
    else:
        publisher.publish_raw(data)


def main(args: list[str] | None = None) -> int:
    return run_node(FoxgloveBridgeNode, args)


if __name__ == "__main__":
    raise SystemExit(main())
