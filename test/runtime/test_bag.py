"""Bag tools: real ROS 2 bags, round trips checked by independent readers, playback timing, bad input."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import numpy as np
import pytest
import yaml
from mcap.reader import make_reader
from rosbags.rosbag2 import Reader as RosbagsReader
from support import TESTDATA as _TESTDATA

from edge_llm_ros.runtime.bag import (
    BagError,
    BagMessage,
    BagReader,
    BagWriter,
    Recorder,
    TopicInfo,
    format_info,
    info,
    play,
    require_topics,
)
from edge_llm_ros.runtime.interfaces import registry

TESTDATA = _TESTDATA / "ros2_bags"
TALKER_BAGS = [TESTDATA / "talker_mcap", TESTDATA / "talker_sqlite3"]
TALKER_FILES = [TESTDATA / "talker_mcap" / "talker.mcap", TESTDATA / "talker_sqlite3" / "talker.db3"]
TALKER_START_NS = 1585866235112411371
TALKER_SPAN_NS = 4531096768
STORAGES = ["mcap", "sqlite3"]


# ------------------------------------------------------------ real ROS 2 bags
@pytest.mark.parametrize("path", TALKER_BAGS + TALKER_FILES, ids=lambda p: p.name)
def test_real_ros2_bag_info(path):
    summary = info(path)
    assert summary["message_count"] == 20
    assert summary["start_ns"] == TALKER_START_NS
    assert summary["duration_ns"] == TALKER_SPAN_NS
    assert summary["storage_id"] == ("mcap" if "mcap" in path.name else "sqlite3")
    counts = {t["name"]: (t["type"], t["count"], t["serialization_format"]) for t in summary["topics"]}
    assert counts["/topic"] == ("std_msgs/msg/String", 10, "cdr")
    assert counts["/rosout"] == ("rcl_interfaces/msg/Log", 10, "cdr")
    assert counts["/parameter_events"][1] == 0

    text = format_info(summary)
    assert "Messages:          20" in text
    assert "Duration:          4.531096768s" in text
    assert "Topic: /topic | Type: std_msgs/msg/String | Count: 10 | Serialization Format: cdr" in text
    assert "(1585866235.112411371)" in text


@pytest.mark.parametrize("path", TALKER_BAGS, ids=lambda p: p.name)
def test_real_ros2_bag_messages_in_order_and_decodable(path):
    reader = BagReader(path)
    messages = list(reader)
    assert len(messages) == 20
    stamps = [m.timestamp_ns for m in messages]
    assert stamps == sorted(stamps)
    assert stamps[0] == reader.start_ns and stamps[-1] == reader.end_ns

    strings = [registry().deserialize(m.data, m.typename).data for m in messages if m.topic == "/topic"]
    assert strings == [f"Hello, world! {i}" for i in range(10)]
    logs = [registry().deserialize(m.data, m.typename) for m in messages if m.topic == "/rosout"]
    assert len(logs) == 10 and all(log.msg.startswith("Publishing: 'Hello, world!") for log in logs)
    assert "durability: 2" in reader.offered_qos("/topic")


# ----------------------------------------------------------------- round trip
def _token_chunk(i: int):
    return registry().new(
        "edge_llm_ros/msg/TokenChunk",
        header=registry().new("std_msgs/msg/Header", frame_id=f"frame{i}"),
        request_id="req-42",
        round=i,
        token_ids=np.arange(i, i + 5, dtype=np.int32),
        text=f"chunk {i} ✓",
        probs=np.linspace(0.1, 0.9, 5, dtype=np.float32) * (i + 1) / 10,
        done=i == 3,
        finish_reason="eos" if i == 3 else "",
    )


def _sample_messages() -> list[tuple[str, str, int, object]]:
    """(topic, type, timestamp, message), deliberately not written in time order."""
    base = 1_700_000_000_000_000_000
    chunk, string = "edge_llm_ros/msg/TokenChunk", "std_msgs/msg/String"
    out = [("/edge_llm/response", chunk, base + 10_000_000 * i, _token_chunk(i)) for i in range(4)]
    out += [
        ("/edge_llm/instruction", string, base + 5_000_000, registry().new(string, data="go")),
        ("/edge_llm/instruction", string, base + 1, registry().new(string, data="")),
    ]
    return out


# Offered QoS as rosbag2 (metadata version <= 8) stores it: YAML with enum values as ints.
QOS = yaml.safe_dump([{
    "history": 1, "depth": 10, "reliability": 1, "durability": 2,
    "deadline": {"sec": 0, "nsec": 0}, "lifespan": {"sec": 0, "nsec": 0}, "liveliness": 1,
    "liveliness_lease_duration": {"sec": 0, "nsec": 0}, "avoid_ros_namespace_conventions": False,
}], sort_keys=False)


def _write_sample(path: Path, storage: str) -> list[tuple[str, str, int, bytes, dict]]:
    written = []
    with BagWriter(path, storage=storage) as bag:
        for topic, typename, stamp, msg in _sample_messages():
            if topic not in bag.topics:
                bag.add_topic(topic, typename, QOS if topic == "/edge_llm/response" else "")
            data = registry().serialize(msg)
            bag.write(topic, stamp, data)
            written.append((topic, typename, stamp, data, registry().to_dict(msg)))
    return sorted(written, key=lambda w: w[2])


@pytest.mark.parametrize("storage", STORAGES)
def test_round_trip_with_our_reader(tmp_path, storage):
    expected = _write_sample(tmp_path / "bag", storage)
    reader = BagReader(tmp_path / "bag")
    assert reader.storage_id == storage
    assert reader.message_count == 6
    assert sorted(reader.topics()) == [
        TopicInfo("/edge_llm/instruction", "std_msgs/msg/String", 2, "cdr"),
        TopicInfo("/edge_llm/response", "edge_llm_ros/msg/TokenChunk", 4, "cdr"),
    ]
    got = list(reader)
    assert [(m.topic, m.typename, m.timestamp_ns, m.data) for m in got] == [w[:4] for w in expected]
    decoded = [registry().to_dict(registry().deserialize(m.data, m.typename)) for m in got]
    assert decoded == [w[4] for w in expected]
    assert "history: keep_last" in reader.offered_qos("/edge_llm/response")
    assert "depth: 10" in reader.offered_qos("/edge_llm/response")
    # The storage file alone reads the same as the directory.
    assert list(BagReader(reader.files[0])) == got


@pytest.mark.parametrize("storage", STORAGES)
def test_round_trip_with_rosbags_reader(tmp_path, storage):
    expected = _write_sample(tmp_path / "bag", storage)
    with RosbagsReader(tmp_path / "bag") as reader:
        assert reader.message_count == 6
        conns = {c.topic: c for c in reader.connections}
        response = conns["/edge_llm/response"]
        assert response.msgtype == "edge_llm_ros/msg/TokenChunk"
        assert response.digest == registry().type_hash("edge_llm_ros/msg/TokenChunk")
        assert response.msgdef.data == registry().msgdef("edge_llm_ros/msg/TokenChunk")
        assert response.ext.offered_qos_profiles[0].depth == 10
        got = [(c.topic, c.msgtype, stamp, bytes(raw)) for c, stamp, raw in reader.messages()]
    assert got == [w[:4] for w in expected]
    assert [registry().to_dict(registry().deserialize(g[3], g[1])) for g in got] == [w[4] for w in expected]


def test_round_trip_with_mcap_package(tmp_path):
    expected = _write_sample(tmp_path / "bag", "mcap")
    (mcap_file,) = (tmp_path / "bag").glob("*.mcap")
    with mcap_file.open("rb") as stream:
        reader = make_reader(stream)
        assert reader.get_header().profile == "ros2"
        got = []
        for schema, channel, message in reader.iter_messages(log_time_order=True):
            assert schema.encoding == "ros2msg"
            assert schema.data.decode() == registry().msgdef(schema.name)
            assert channel.message_encoding == "cdr"
            got.append((channel.topic, schema.name, message.log_time, message.data))
        stats = reader.get_summary().statistics
    assert got == [w[:4] for w in expected]
    assert stats.message_count == 6
    assert got[0][0] == "/edge_llm/response"
    first = registry().deserialize(got[0][3], "edge_llm_ros/msg/TokenChunk")
    np.testing.assert_array_equal(first.token_ids, np.arange(0, 5, dtype=np.int32))
    assert first.probs.dtype == np.float32 and first.text == "chunk 0 ✓"


def test_writer_metadata_is_rosbag2_version_9(tmp_path):
    _write_sample(tmp_path / "bag", "sqlite3")
    meta = yaml.safe_load((tmp_path / "bag" / "metadata.yaml").read_text())["rosbag2_bagfile_information"]
    assert meta["version"] == 9 and meta["storage_identifier"] == "sqlite3"
    assert meta["message_count"] == 6
    topics = [t["topic_metadata"] for t in meta["topics_with_message_count"]]
    hashes = {t["name"]: t["type_description_hash"] for t in topics}
    assert hashes["/edge_llm/instruction"] == registry().type_hash("std_msgs/msg/String")
    assert hashes["/edge_llm/instruction"].startswith("RIHS01_")


def test_mcap_without_statistics_is_scanned(tmp_path):
    from mcap.writer import IndexType
    from mcap.writer import Writer as McapWriter

    path, string = tmp_path / "plain.mcap", "std_msgs/msg/String"
    with path.open("wb") as stream:
        writer = McapWriter(stream, index_types=IndexType.NONE, use_statistics=False, use_summary_offsets=False)
        writer.start(profile="ros2", library="test")
        schema = writer.register_schema(string, "ros2msg", registry().msgdef(string).encode())
        channel = writer.register_channel("/chat", "cdr", schema, {"offered_qos_profiles": ""})
        for i in (3, 1, 2):
            data = registry().serialize(registry().new(string, data=f"m{i}"))
            writer.add_message(channel, log_time=i * 1000, data=data, publish_time=i * 1000)
        writer.finish()
    reader = BagReader(path)
    assert (reader.message_count, reader.start_ns, reader.end_ns) == (3, 1000, 3000)
    assert reader.topics() == [TopicInfo("/chat", string, 3, "cdr")]
    assert [registry().deserialize(m.data, m.typename).data for m in reader] == ["m1", "m2", "m3"]


def test_directory_without_metadata_merges_storage_files(tmp_path):
    _write_sample(tmp_path / "ours", "sqlite3")
    merged = tmp_path / "merged"
    merged.mkdir()
    (merged / "a.mcap").write_bytes((TESTDATA / "talker_mcap" / "talker.mcap").read_bytes())
    (merged / "b.db3").write_bytes(next((tmp_path / "ours").glob("*.db3")).read_bytes())
    reader = BagReader(merged)
    assert reader.message_count == 26 and len(reader.files) == 2
    assert reader.start_ns == TALKER_START_NS and reader.end_ns == 1_700_000_000_030_000_000
    stamps = [m.timestamp_ns for m in reader]
    assert len(stamps) == 26 and stamps == sorted(stamps)
    assert {t.name: t.count for t in reader.topics()}["/edge_llm/response"] == 4


# ---------------------------------------------------------------- recorder
def test_recorder_is_thread_safe_and_adds_topics(tmp_path):
    msg = registry().serialize(registry().new("std_msgs/msg/String", data="x"))
    with BagWriter(tmp_path / "bag") as bag:
        recorder = Recorder(bag)

        def feed(worker: int) -> None:
            for i in range(50):
                recorder.on_message(f"/w{worker % 2}", "std_msgs/String", msg, timestamp_ns=1000 * i + worker)

        threads = [threading.Thread(target=feed, args=(w,)) for w in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=10)
        assert recorder.count == 200
        with pytest.raises(BagError, match="recorded as std_msgs/msg/String"):
            recorder.on_message("/w0", "std_msgs/msg/Bool", b"\x00\x01\x00\x00\x01")
    reader = BagReader(tmp_path / "bag")
    assert {t.name: t.count for t in reader.topics()} == {"/w0": 100, "/w1": 100}
    assert all(m.data == msg for m in reader)


# -------------------------------------------------------------------- play
class FakeClock:
    """A clock that only moves when someone sleeps (or the test advances it)."""

    def __init__(self) -> None:
        self.now = 100.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


@pytest.mark.parametrize("path", TALKER_BAGS, ids=lambda p: p.name)
@pytest.mark.parametrize("rate", [1.0, 2.0])
def test_play_preserves_timing(path, rate):
    clock, out = FakeClock(), []
    reader = BagReader(path)
    count = play(reader, lambda *m: out.append((clock.now, *m)), rate=rate, clock=clock, sleep=clock.sleep)
    assert count == 20 and len(out) == 20
    assert sum(clock.sleeps) == pytest.approx(TALKER_SPAN_NS / 1e9 / rate, abs=1e-6)
    # Every message goes out at its recorded offset / rate.
    recorded = [m.timestamp_ns for m in reader]
    sent = [t - 100.0 for t, *_ in out]
    assert sent == pytest.approx([(ts - recorded[0]) / 1e9 / rate for ts in recorded], abs=1e-6)
    strings = [registry().deserialize(data, typ).data for _t, topic, typ, data in out if topic == "/topic"]
    assert strings == [f"Hello, world! {i}" for i in range(10)]


def test_play_time_spent_publishing_does_not_accumulate():
    clock = FakeClock()

    def slow_publish(*_msg):
        clock.now += 0.01

    play(BagReader(TALKER_BAGS[0]), slow_publish, clock=clock, sleep=clock.sleep)
    assert clock.now - 100.0 == pytest.approx(TALKER_SPAN_NS / 1e9 + 0.01, abs=1e-6)


def test_play_topic_filter_and_start_offset():
    clock, out = FakeClock(), []
    reader = BagReader(TALKER_BAGS[1])
    count = play(reader, lambda *m: out.append(m), topics=["/topic"], clock=clock, sleep=clock.sleep)
    assert count == 10 and {topic for topic, _t, _d in out} == {"/topic"}

    stamps = [m.timestamp_ns for m in reader if m.topic == "/topic"]
    offset_s = (stamps[5] - reader.start_ns) / 1e9
    clock2, later = FakeClock(), []
    count = play(
        reader, lambda *m: later.append(m), topics=["/topic"], start_offset_s=offset_s, clock=clock2, sleep=clock2.sleep
    )
    assert count == 5
    assert [registry().deserialize(d, t).data for _topic, t, d in later] == [f"Hello, world! {i}" for i in range(5, 10)]
    assert sum(clock2.sleeps) == pytest.approx((stamps[-1] - stamps[5]) / 1e9, abs=1e-6)


def test_play_stop_event_and_loop():
    clock, stop, out = FakeClock(), threading.Event(), []

    def publish(*msg):
        out.append(msg)
        if len(out) == 3:
            stop.set()

    assert play(BagReader(TALKER_BAGS[0]), publish, clock=clock, sleep=clock.sleep, stop=stop) == 3

    stop2, looped = threading.Event(), []

    def publish_looped(*msg):
        looped.append(msg)
        if len(looped) == 45:
            stop2.set()

    clock2 = FakeClock()
    reader = BagReader(TALKER_BAGS[0])
    count = play(reader, publish_looped, loop=True, rate=1000, clock=clock2, sleep=clock2.sleep, stop=stop2)
    assert count == 45 and looped[20] == looped[0] and looped[40] == looped[0]


def test_play_default_sleep_is_cut_short_by_stop():
    # With a stop event and no sleep given, the gap wait is stop.wait: setting it ends playback promptly.
    stop, out = threading.Event(), []
    done = threading.Event()

    def run():
        out.append(play(BagReader(TALKER_BAGS[0]), lambda *m: stop.set(), rate=1e-6, stop=stop))
        done.set()

    threading.Thread(target=run, daemon=True).start()
    assert done.wait(timeout=5), "playback did not stop"
    assert out == [1]


@pytest.mark.parametrize("rate", [1.0, 0.25])
def test_play_clock_ticks_the_bag_time_of_the_playback_position(rate):
    """`--clock` as `ros2 bag play --clock` defines it: every 1/hz s of playback, from its start to its
    last message, the bag time at that point (the bag's start + elapsed playback * rate); the messages
    keep their timing."""
    clock, sent, ticks, hz = FakeClock(), [], [], 40.0
    reader = BagReader(TALKER_BAGS[0])
    count = play(reader, lambda *m: sent.append(clock.now - 100.0), rate=rate, clock=clock, sleep=clock.sleep,
                 clock_hz=hz, publish_clock=lambda ns: ticks.append((clock.now - 100.0, ns)))
    assert count == 20
    recorded = [m.timestamp_ns for m in reader]
    assert sent == pytest.approx([(ts - recorded[0]) / 1e9 / rate for ts in recorded], abs=1e-6)
    assert [at for at, _ in ticks] == pytest.approx([k / hz for k in range(len(ticks))], abs=1e-6)
    assert ticks[-1][0] <= sent[-1] + 1e-9 < ticks[-1][0] + 1 / hz
    assert [ns for _, ns in ticks] == [reader.start_ns + round(at * rate * 1e9) for at, _ in ticks]


@pytest.mark.parametrize("kwargs, match", [
    ({"clock_hz": -1.0}, "clock_hz must be a positive"),
    ({"clock_hz": 40.0}, "clock_hz needs publish_clock"),
    ({"rate": 0}, "rate must be a positive"),
    ({"rate": -1.0}, "rate must be a positive"),
    ({"rate": float("nan")}, "rate must be a positive"),
    ({"start_offset_s": -1}, "start_offset_s"),
    ({"topics": ["/nope"]}, "not in bag.*?/nope"),
])
def test_play_rejects_bad_arguments(kwargs, match):
    with pytest.raises(BagError, match=match):
        play(BagReader(TALKER_BAGS[0]), lambda *m: None, **kwargs)


# --------------------------------------------------------------- bad input
def test_reader_missing_path(tmp_path):
    with pytest.raises(BagError, match="does not exist"):
        BagReader(tmp_path / "nope")


def test_reader_directory_that_is_not_a_bag(tmp_path):
    (tmp_path / "notes.txt").write_text("hi")
    with pytest.raises(BagError, match="is not a bag"):
        BagReader(tmp_path)


def test_reader_truncated_mcap(tmp_path):
    data = (TESTDATA / "talker_mcap" / "talker.mcap").read_bytes()
    path = tmp_path / "cut.mcap"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(BagError, match="truncated MCAP file"):
        BagReader(path)


def test_reader_corrupted_mcap_summary(tmp_path):
    data = bytearray((TESTDATA / "talker_mcap" / "talker.mcap").read_bytes())
    data[-40:-8] = b"\xff" * 32  # smash the footer, keep both magics
    path = tmp_path / "bad.mcap"
    path.write_bytes(bytes(data))
    with pytest.raises(BagError, match="corrupted MCAP file"):
        BagReader(path)


def test_reader_corrupted_mcap_chunk_fails_while_reading(tmp_path):
    data = bytearray((TESTDATA / "talker_mcap" / "talker.mcap").read_bytes())
    data[3000:3100] = bytes(100)  # inside the (zstd-compressed) chunk; summary intact
    path = tmp_path / "bad.mcap"
    path.write_bytes(bytes(data))
    reader = BagReader(path)
    assert reader.message_count == 20
    with pytest.raises(BagError, match="corrupted MCAP file"):
        list(reader)


def test_reader_truncated_db3(tmp_path):
    data = (TESTDATA / "talker_sqlite3" / "talker.db3").read_bytes()
    path = tmp_path / "cut.db3"
    path.write_bytes(data[:5000])
    with pytest.raises(BagError, match="SQLite3"):
        list(BagReader(path))


@pytest.mark.parametrize("name", ["garbage.mcap", "garbage.db3", "garbage.bin"])
def test_reader_garbage_file(tmp_path, name):
    path = tmp_path / name
    path.write_bytes(os.urandom(4096))
    with pytest.raises(BagError, match="not a bag file"):
        BagReader(path)


def test_reader_metadata_listing_missing_file(tmp_path):
    _write_sample(tmp_path / "bag", "mcap")
    next((tmp_path / "bag").glob("*.mcap")).unlink()
    with pytest.raises(BagError, match="lists .* which does not exist"):
        BagReader(tmp_path / "bag")


def test_writer_errors(tmp_path):
    with pytest.raises(BagError, match="unknown storage 'rosbag1'"):
        BagWriter(tmp_path / "a", storage="rosbag1")
    (tmp_path / "exists").mkdir()
    with pytest.raises(BagError, match="already exists"):
        BagWriter(tmp_path / "exists")
    with BagWriter(tmp_path / "b") as bag:
        with pytest.raises(BagError, match="unknown topic '/x'"):
            bag.write("/x", 1, b"")
        with pytest.raises(BagError, match="unknown message type"):
            bag.add_topic("/x", "nope_msgs/msg/Nope")
        with pytest.raises(BagError, match="must be absolute"):
            bag.add_topic("relative", "std_msgs/msg/String")
        with pytest.raises(BagError, match="qos_profiles"):
            bag.add_topic("/q", "std_msgs/msg/String", "- depth: 1")
        bag.add_topic("/x", "std_msgs/msg/String")
        with pytest.raises(BagError, match="timestamp_ns"):
            bag.write("/x", -5, b"")
    with pytest.raises(BagError, match="not open"):
        bag.write("/x", 1, b"")


@pytest.mark.parametrize("storage", STORAGES)
def test_empty_bag(tmp_path, storage):
    with BagWriter(tmp_path / "bag", storage=storage) as bag:
        bag.add_topic("/x", "std_msgs/String")
    summary = info(tmp_path / "bag")
    assert (summary["message_count"], summary["start_ns"], summary["duration_ns"]) == (0, 0, 0)
    assert summary["topics"] == [{"name": "/x", "type": "std_msgs/msg/String", "count": 0, "serialization_format": "cdr"}]
    assert play(BagReader(tmp_path / "bag"), lambda *m: None, loop=True) == 0


def test_writer_finalises_bag_when_block_raises(tmp_path):
    data = registry().serialize(registry().new("std_msgs/msg/String", data="kept"))
    with pytest.raises(KeyboardInterrupt):
        with BagWriter(tmp_path / "bag") as bag:
            bag.add_topic("/x", "std_msgs/msg/String")
            bag.write("/x", 5, data)
            raise KeyboardInterrupt
    assert list(BagReader(tmp_path / "bag")) == [BagMessage("/x", "std_msgs/msg/String", 5, data)]


# ------------------------------------------- replay inputs: required topics
NAV_BAGS = Path(__file__).resolve().parents[1] / "data" / "nav_bags"  # python -m edge_llm_ros.tools.nav_bags


def test_require_topics_names_the_missing_topic_its_type_and_the_bags_topics():
    reader = BagReader(NAV_BAGS / "no_camera")
    with pytest.raises(BagError) as raised:
        require_topics(reader, {"/camera/image_raw": "sensor_msgs/Image", "/edge_llm/instruction": None})
    assert str(raised.value) == (
        f"bag '{NAV_BAGS / 'no_camera'}' has no /camera/image_raw (sensor_msgs/msg/Image); "
        "its topics: /edge_llm/instruction (std_msgs/msg/String, 2 messages)")
    require_topics(BagReader(NAV_BAGS / "moving"),
                   {"/camera/image_raw": "sensor_msgs/msg/Image", "/edge_llm/instruction": "std_msgs/msg/String"})


def test_require_topics_refuses_another_type_and_an_empty_topic(tmp_path):
    with BagWriter(tmp_path / "bag") as bag:
        bag.add_topic("/camera/image_raw", "sensor_msgs/msg/CompressedImage")
        bag.add_topic("/edge_llm/instruction", "std_msgs/msg/String")
        bag.write("/camera/image_raw", 1, registry().serialize(registry().new("sensor_msgs/msg/CompressedImage")))
    with pytest.raises(BagError, match=r"has /camera/image_raw as sensor_msgs/msg/CompressedImage, not "
                                       r"sensor_msgs/msg/Image; no messages on /edge_llm/instruction; its topics: "):
        require_topics(BagReader(tmp_path / "bag"),
                       {"/camera/image_raw": "sensor_msgs/msg/Image", "/edge_llm/instruction": None})


def test_zstd_chunks_read_back_everywhere(tmp_path):
    frame = registry().new("sensor_msgs/msg/Image", height=96, width=128, encoding="rgb8", step=384,
                           data=np.full(96 * 384, 7, dtype=np.uint8))
    data = registry().serialize(frame)
    with BagWriter(tmp_path / "bag", compression="zstd") as bag:
        bag.add_topic("/camera/image_raw", "sensor_msgs/msg/Image")
        for i in range(20):
            bag.write("/camera/image_raw", i, data)
    assert BagReader(tmp_path / "bag").size_bytes < len(data)  # 20 frames in less than one
    assert [m.data for m in BagReader(tmp_path / "bag")] == [data] * 20
    with RosbagsReader(tmp_path / "bag") as reader:
        assert [bytes(raw) for _, _, raw in reader.messages()] == [data] * 20
    with next((tmp_path / "bag").glob("*.mcap")).open("rb") as stream:
        assert {c.compression for c in make_reader(stream).get_summary().chunk_indexes} == {"zstd"}
    with pytest.raises(BagError, match="compresses MCAP chunks; storage 'sqlite3'"):
        BagWriter(tmp_path / "db", storage="sqlite3", compression="zstd")
    with pytest.raises(BagError, match="unknown compression 'lz5'"):
        BagWriter(tmp_path / "lz", compression="lz5")
