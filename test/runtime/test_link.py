"""Link emulation: the shaper alone, its parameters, and a 50 ms / 20 Mbit/s link between two real processes."""

from __future__ import annotations

import math
import sys
import threading
import time
from pathlib import Path

import pytest
from support import Proc

from edge_llm_ros.runtime.interfaces import registry
from edge_llm_ros.runtime.link import Link, LinkSpec, ShapedPublisher, TokenBucket, parse_link_params
from edge_llm_ros.runtime.params import ParamsError

PEER = Path(__file__).parent / "peers" / "link_peer.py"


class Recorder:
    """A deliver() callback that records (payload, monotonic time) and signals after `expected` messages."""

    def __init__(self, expected: int) -> None:
        self.expected = expected
        self.got: list[tuple[object, float]] = []
        self.done = threading.Event()

    def __call__(self, payload: object) -> None:
        self.got.append((payload, time.monotonic()))
        if len(self.got) >= self.expected:
            self.done.set()


def link_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("link ")]


# ------------------------------------------------------------------ shaper
def test_latency_only_delays_each_message_by_the_latency():
    link = Link(LinkSpec(latency_ms=40.0), "lat")
    rec = Recorder(5)
    schedules = [link.send(f"m{i}".encode(), None, rec) for i in range(5)]
    assert rec.done.wait(5), "messages not delivered"
    link.close()
    for sched, (_, delivered) in zip(schedules, rec.got):
        assert sched.departure == sched.sent  # no rate limit: leaves at once
        assert sched.delay == pytest.approx(0.040)
        assert delivered >= sched.arrival  # never early; how late on a loaded machine is bench's to say


def test_bandwidth_only_caps_throughput():
    n, size, mbps = 10, 25_000, 10.0  # 20 ms of serialization each, 200 ms in all
    link = Link(LinkSpec(bandwidth_mbps=mbps), "bw")
    rec = Recorder(n)
    first_sent = time.monotonic()
    schedules = [link.send(bytes(size), size, rec) for _ in range(n)]
    assert rec.done.wait(10), "messages not delivered"
    elapsed = rec.got[-1][1] - first_sent
    link.close()
    per_message = size * 8 / (mbps * 1e6)
    assert elapsed >= n * per_message
    # Back to back: each message leaves one serialization time after the one before it.
    gaps = [b.departure - a.departure for a, b in zip(schedules, schedules[1:])]
    assert gaps == pytest.approx([per_message] * (n - 1))
    assert all(s.arrival == s.departure for s in schedules)  # no latency configured


def test_token_bucket_burst_then_rate():
    # 1000 B/s, bucket of 300 B: three 100 B messages leave at once, the next waits 0.1 s per message.
    bucket = TokenBucket(1000.0, 300)
    assert [bucket.departure(0.0, 100) for _ in range(5)] == pytest.approx([0.0, 0.0, 0.0, 0.1, 0.2])
    # After a long idle spell the bucket is full again, but never fuller.
    assert [bucket.departure(10.0, 100) for _ in range(4)] == pytest.approx([10.0, 10.0, 10.0, 10.1])
    # No burst: every message waits its own serialization time.
    wire = TokenBucket(1000.0)
    departures = [wire.departure(0.0, 100), wire.departure(0.0, 50), wire.departure(5.0, 100)]
    assert departures == pytest.approx([0.1, 0.15, 5.1])


def test_order_is_preserved_across_sizes_and_senders():
    link = Link(LinkSpec(latency_ms=5.0, bandwidth_mbps=50.0), "order")
    rec = Recorder(200)
    sent: list[int] = []
    lock = threading.Lock()

    def sender(offset: int) -> None:
        for i in range(100):
            with lock:  # the order of send() calls is the order to keep
                sent.append(offset + i)
                link.send(offset + i, (offset + i) % 7 * 500, rec)

    threads = [threading.Thread(target=sender, args=(k * 1000,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert rec.done.wait(10), "messages not delivered"
    link.close()
    assert [p for p, _ in rec.got] == sent
    assert [t for _, t in rec.got] == sorted(t for _, t in rec.got)


def test_zero_config_delivers_immediately_without_a_thread():
    before = link_threads()
    link = Link(LinkSpec(), "none")
    rec = Recorder(1)
    sched = link.send(b"x", None, rec)
    assert rec.got and rec.got[0][0] == b"x", "not delivered before send() returned"
    assert sched.sent == sched.departure == sched.arrival
    assert link_threads() == before
    assert link.close() == 0


@pytest.mark.parametrize("kwargs, field", [
    ({"latency_ms": -1.0}, "latency_ms"),
    ({"latency_ms": math.nan}, "latency_ms"),
    ({"latency_ms": math.inf}, "latency_ms"),
    ({"latency_ms": "25"}, "latency_ms"),
    ({"latency_ms": True}, "latency_ms"),
    ({"bandwidth_mbps": 0.0}, "bandwidth_mbps"),
    ({"bandwidth_mbps": -20.0}, "bandwidth_mbps"),
    ({"bandwidth_mbps": math.nan}, "bandwidth_mbps"),
    ({"bandwidth_mbps": 20.0, "burst_bytes": -1}, "burst_bytes"),
    ({"bandwidth_mbps": 20.0, "burst_bytes": 1.5}, "burst_bytes"),
    ({"burst_bytes": 1500}, "burst_bytes"),  # a burst without a rate
])
def test_bad_spec_names_the_field(kwargs, field):
    with pytest.raises(ValueError, match=rf"^{field}"):
        LinkSpec(**kwargs)


def test_close_discards_pending_and_leaves_no_thread():
    link = Link(LinkSpec(latency_ms=10_000.0), "slow")
    assert len(link_threads()) >= 1
    rec = Recorder(1)
    for i in range(3):
        link.send(i, 10, rec)
    assert link.pending == 3
    assert link.close() == 3
    assert not rec.got
    assert not any(t.name == "link slow" for t in link_threads())
    with pytest.raises(RuntimeError, match="closed"):
        link.send(b"late", None, rec)


def test_close_with_drain_delivers_pending_first():
    link = Link(LinkSpec(latency_ms=30.0, bandwidth_mbps=8.0), "drain")
    rec = Recorder(4)
    schedules = [link.send(i, 1000, rec) for i in range(4)]  # 1 ms each on the wire
    assert link.close(drain=True) == 0
    assert [p for p, _ in rec.got] == [0, 1, 2, 3]
    assert rec.got[-1][1] >= schedules[-1].arrival
    assert not any(t.name == "link drain" for t in link_threads())


def test_a_growing_backlog_is_logged_once_and_nothing_is_dropped():
    warnings: list[str] = []
    link = Link(LinkSpec(bandwidth_mbps=1.0), "thin", warn=warnings.append, backlog_warn_s=0.5)
    rec = Recorder(3)
    for _ in range(3):
        link.send(b"", 100_000, rec)  # 0.8 s each at 1 Mbit/s
    assert len(warnings) == 1 and "backlog" in warnings[0] and "thin" in warnings[0]
    assert link.pending == 3
    assert link.close() == 3


def test_a_failing_delivery_is_reported_and_the_link_keeps_going():
    warnings: list[str] = []
    link = Link(LinkSpec(latency_ms=1.0), "flaky", warn=warnings.append)
    rec = Recorder(1)

    def boom(_payload):
        raise OSError("publisher gone")

    link.send(b"a", None, boom)
    link.send(b"b", None, rec)
    assert rec.done.wait(5)
    link.close()
    assert any("publisher gone" in w for w in warnings)


def test_shaped_publisher_wraps_any_publish():
    class FakePublisher:
        topic_name = "/t"

        def __init__(self):
            self.rec = Recorder(2)

        def publish(self, msg):
            self.rec(msg)

    fake = FakePublisher()
    link = Link(LinkSpec(latency_ms=20.0), "wrap")
    pub = ShapedPublisher(fake, link, size_of=len)
    first = pub.publish("ab")
    pub.publish("cd")
    assert pub.topic_name == "/t"
    assert fake.rec.done.wait(5)
    link.close()
    assert [m for m, _ in fake.rec.got] == ["ab", "cd"]
    assert fake.rec.got[0][1] >= first.arrival


# --------------------------------------------------------------- parameters
def test_params_layout_parses():
    configs = parse_link_params({
        "chunk_words": 1,
        "link_emulation.links": ["uplink", "downlink"],
        "link_emulation.uplink.topics": ["draft", "/edge_llm/prune"],
        "link_emulation.uplink.latency_ms": 25,
        "link_emulation.uplink.bandwidth_mbps": 20.0,
        "link_emulation.uplink.burst_bytes": 1500,
        "link_emulation.downlink.topics": ["verify"],
        "link_emulation.downlink.latency_ms": 25.0,
    })
    assert [(c.name, c.topics) for c in configs] == [
        ("uplink", ("draft", "/edge_llm/prune")), ("downlink", ("verify",))]
    assert configs[0].spec == LinkSpec(25.0, 20.0, 1500)
    assert configs[1].spec == LinkSpec(latency_ms=25.0)  # bandwidth unlimited when left out
    assert parse_link_params({"chunk_words": 1}) == []
    assert parse_link_params({"link_emulation.links": []}) == []


@pytest.mark.parametrize("params, message", [
    ({"link_emulation.links": ["up"], "link_emulation.up.topics": ["t"], "link_emulation.up.latency_ms": -5.0},
     "link_emulation.up.latency_ms must be"),
    ({"link_emulation.links": ["up"], "link_emulation.up.topics": ["t"], "link_emulation.up.bandwidth_mbps": 0.0},
     "link_emulation.up.bandwidth_mbps must be"),
    ({"link_emulation.links": ["up"], "link_emulation.up.topics": ["t"], "link_emulation.up.latency": 5.0},
     "link_emulation.up.latency: unknown link setting 'latency'"),
    ({"link_emulation.up.topics": ["t"], "link_emulation.up.latency_ms": 5.0},
     "'up' is not a link named in link_emulation.links"),
    ({"link_emulation.links": ["up"], "link_emulation.up.latency_ms": 5.0},
     "link_emulation.up.topics must be a non-empty list"),
    ({"link_emulation.links": "up"}, "link_emulation.links must be a list"),
    ({"link_emulation.links": ["up", "up"], "link_emulation.up.topics": ["t"]}, "names a link twice"),
])
def test_bad_params_name_the_parameter(params, message):
    with pytest.raises(ParamsError, match=message.replace(".", r"\.").replace("(", r"\(")):
        parse_link_params(params)


# ------------------------------------------------------- embedded backend
def test_embedded_node_shapes_its_configured_topics(rt_session):
    rt = rt_session
    from edge_llm_ros import runtime as rtf

    String = rtf.message("std_msgs/msg/String")
    sender = rt.Node("link_sender", namespace="link_inproc", parameter_overrides={
        "link_emulation.links": ["up"],
        "link_emulation.up.topics": ["shaped"],
        "link_emulation.up.latency_ms": 40.0,
    })
    sink = rt.Node("link_sink", namespace="link_inproc")
    try:
        assert sender.get_parameter("link_emulation.up.latency_ms").value == 40.0
        arrivals: dict[str, float] = {}
        got_both = threading.Event()

        def on_raw(topic, _type, _data, _t_ns):
            arrivals.setdefault(topic, time.monotonic())
            if len(arrivals) == 2:
                got_both.set()

        for topic in ("shaped", "plain"):
            sink.create_subscription(String, topic, on_raw, 10, raw=True)
        shaped = rtf.shaped(sender, sender.create_publisher(String, "shaped", 10))
        plain = sender.create_publisher(String, "plain", 10)
        assert shaped.link is not None and shaped.link.spec.latency_ms == 40.0
        assert sender.emulated_links.get("/link_inproc/shaped") is shaped.link  # the node's links, declared
        assert plain.link is None
        assert shaped.wait_for_subscribers(20) and plain.wait_for_subscribers(20)
        sent = time.monotonic()
        shaped.publish(String(data="late"))
        plain.publish(String(data="now"))
        assert got_both.wait(10), f"only {sorted(arrivals)} arrived"
        assert arrivals["/link_inproc/shaped"] - sent >= 0.040
        assert arrivals["/link_inproc/plain"] < arrivals["/link_inproc/shaped"]
    finally:
        sender.destroy_node()
        sink.destroy_node()
    assert not any(t.name == "link up" for t in link_threads()), "destroy_node left the link thread running"


def test_embedded_node_rejects_a_bad_link(rt_session):
    with pytest.raises(ParamsError, match=r"link_emulation\.up\.bandwidth_mbps must be"):
        rt_session.Node("bad_link", namespace="link_inproc", parameter_overrides={
            "link_emulation.links": ["up"], "link_emulation.up.topics": ["x"], "link_emulation.up.bandwidth_mbps": -1.0,
        })


# ------------------------------------------------------ two real processes
PARAMS = """\
link_test:
  link_peer:
    ros__parameters:
      link_emulation:
        links: [uplink]
        uplink:
          topics: [probe]
          latency_ms: {latency}
          bandwidth_mbps: 20.0
"""


@pytest.mark.slow
@pytest.mark.serial
@pytest.mark.timeout(180)
def test_emulated_link_between_two_processes(rt_session, tmp_path):
    """A 50 ms one-way, 20 Mbit/s link set in YAML delays real messages from another process."""
    params = tmp_path / "link.yaml"
    params.write_text(PARAMS.format(latency=50.0))
    sink = rt_session.Node("link_sink", namespace="link_test")
    arrivals: list[tuple[int, bytes]] = []
    expected = 22  # link_peer: 20 small, one 1 MB, one small
    all_in = threading.Event()

    def on_raw(_topic, _type, data, t_ns):  # Zenoh's thread, right at arrival
        arrivals.append((t_ns, data))
        if len(arrivals) == expected:
            all_in.set()

    sink.create_subscription("sensor_msgs/msg/Image", "probe", on_raw, 100, raw=True)
    peer = Proc([sys.executable, str(PEER), "--ros-args", "--params-file", str(params)])
    try:
        peer.wait_for_line("emulated link on /link_test/probe: 50.0 ms one-way, 20.0 Mbit/s", 60)
        assert all_in.wait(60), f"{len(arrivals)} of {expected} messages arrived; peer output:\n{peer.output}"
        assert f"SENT {expected}" in peer.output
    finally:
        peer.stop()
        sink.destroy_node()

    reg = registry()
    seqs, delays, sizes = [], [], []
    for t_ns, data in arrivals:
        msg = reg.deserialize(data, "sensor_msgs/msg/Image")
        seqs.append(int(msg.header.frame_id))
        delays.append((t_ns - (msg.header.stamp.sec * 1_000_000_000 + msg.header.stamp.nanosec)) / 1e6)
        sizes.append(len(data))
    assert seqs == list(range(expected)), "reordered"
    small, big, after_big = delays[:20], delays[20], delays[21]
    print(f"\nemulated link 50 ms / 20 Mbit/s: small messages {min(small):.1f}-{max(small):.1f} ms "
          f"(median {sorted(small)[10]:.1f}), {sizes[20] / 1e6:.2f} MB message {big:.1f} ms, "
          f"small one behind it {after_big:.1f} ms")
    assert min(small) >= 50.0, small
    assert sorted(small)[10] < 80.0 and max(small) < 250.0, f"far more than 50 ms: {small}"
    # 1 MB at 20 Mbit/s is 400 ms on the wire, plus the 50 ms latency.
    assert sizes[20] >= 1_000_000
    assert 450.0 <= big < 1200.0, big
    # The small message sent right after it queues behind it (on an unshaped wire it would take ~50 ms).
    assert after_big >= 400.0, after_big


@pytest.mark.slow
def test_bad_link_in_yaml_stops_the_node_with_one_line(router_endpoint, tmp_path):
    params = tmp_path / "bad.yaml"
    params.write_text(PARAMS.format(latency=-5.0))
    peer = Proc([sys.executable, str(PEER), "--ros-args", "--params-file", str(params)])
    assert peer.wait(60) == 2
    assert "error: parameter link_emulation.uplink.latency_ms must be a finite number >= 0" in peer.output
