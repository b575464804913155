"""rosbag2 bags without ROS 2: record, inspect and replay.

This module deals only in (topic, type name, timestamp in ns, CDR bytes); it
knows nothing about the middleware that produced or will consume the bytes.
The CLI (`edge-llm-ros bag record|play|info`) wires it to live topics.

- `BagWriter` writes a real rosbag2 directory (metadata.yaml plus one `.mcap`
  or `.db3` file) through rosbags' writer, metadata version 9 as ROS 2 Jazzy
  writes it, with each type's message definition and RIHS01 hash; MCAP chunks
  optionally zstd-compressed (as rosbag2's mcap `zstd_fast` preset).
- `BagReader` reads rosbag2 directories or single `.mcap` / `.db3` files
  written by ROS 2 or by `BagWriter`. It reads MCAP with the `mcap` package and
  SQLite3 with plain `sqlite3`, not with rosbags' reader: that one yields no
  messages from bags whose database topic ids differ from the metadata order,
  which real ROS 2 bags do (see /work/shared/testdata/README.md).
- `info` / `format_info` summarise a bag the way `ros2 bag info` does.
- `play` replays a reader through a `publish(topic, typename, data)` callback
  with the recorded timing; clock and sleep are injectable for tests.
  `require_topics` refuses a bag that lacks a topic a replay needs, naming it.
- `Recorder` is a thread-safe sink that subscriptions call per message.
"""

from __future__ import annotations

import datetime
import heapq
import math
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, NamedTuple

import yaml
from mcap.reader import make_reader
from mcap.records import Channel, Message, Schema
from mcap.stream_reader import StreamReader
from rosbags.rosbag2 import StoragePlugin, Writer, WriterError
from rosbags.rosbag2.enums import CompressionFormat, CompressionMode
from rosbags.rosbag2.errors import ReaderError
from rosbags.rosbag2.metadata import parse_qos

from edge_llm_ros.runtime.interfaces import InterfaceError, normalize_name, registry

STORAGES = {"mcap": StoragePlugin.MCAP, "sqlite3": StoragePlugin.SQLITE3}
COMPRESSIONS = ("none", "zstd")  # zstd: MCAP chunks compressed; metadata.yaml says none, as rosbag2's presets
DEFAULT_STORAGE = "mcap"  # rosbag2's default since Iron
METADATA_VERSION = 9  # what ROS 2 Jazzy writes

MCAP_MAGIC = b"\x89MCAP0\r\n"
SQLITE_MAGIC = b"SQLite format 3\x00"
_STORAGE_SUFFIXES = {".mcap": "mcap", ".db3": "sqlite3"}



class BagError(Exception):
    """A bag that cannot be written or read; the message says why in one line."""


class BagMessage(NamedTuple):
    """One recorded message: the CDR bytes as they went over the wire."""

    topic: str
    typename: str
    timestamp_ns: int
    data: bytes


class TopicInfo(NamedTuple):
    """A topic in a bag, as `ros2 bag info` lists it."""

    name: str
    type: str
    count: int
    serialization_format: str


# =====================================================================  writing
class BagWriter:
    """Write a rosbag2 directory; use it as a context manager.

        with BagWriter("out/run1") as bag:              # mcap by default
            bag.add_topic("/edge_llm/response", "edge_llm_ros/msg/TokenChunk")
            bag.write("/edge_llm/response", time.time_ns(), cdr_bytes)

    Leaving the `with` block finalises the bag (index, metadata.yaml) even
    when it is left by an exception such as Ctrl-C, so what was recorded
    stays readable. `compression="zstd"` compresses each MCAP chunk (any
    MCAP reader, ROS 2's included, reads it; camera frames shrink most).
    """

    def __init__(self, path: str | Path, storage: str = DEFAULT_STORAGE, compression: str = "none"):
        self.path = Path(path)
        if storage not in STORAGES:
            raise BagError(f"unknown storage '{storage}' (choose one of: {', '.join(STORAGES)})")
        if compression not in COMPRESSIONS:
            raise BagError(f"unknown compression '{compression}' (choose one of: {', '.join(COMPRESSIONS)})")
        if compression != "none" and storage != "mcap":
            raise BagError(f"compression '{compression}' compresses MCAP chunks; storage '{storage}' has none")
        if self.path.exists():
            raise BagError(f"output '{self.path}' already exists; choose a new directory")
        self.storage = storage
        self.compression = compression
        self._writer: Writer | None = None
        self._connections: dict[str, Any] = {}
        self._typenames: dict[str, str] = {}
        self.message_count = 0

    @property
    def topics(self) -> Mapping[str, str]:
        """Topic name -> type name of every topic added so far (a read-only view)."""
        return MappingProxyType(self._typenames)

    def open(self) -> BagWriter:
        """Create the directory and the storage file."""
        if self._writer is not None:
            raise BagError(f"bag '{self.path}' is already open")
        try:
            writer = Writer(self.path, version=METADATA_VERSION, storage_plugin=STORAGES[self.storage])
            if self.compression == "zstd":
                writer.set_compression(CompressionMode.STORAGE, CompressionFormat.ZSTD)
            writer.open()
        except (WriterError, OSError) as exc:
            raise BagError(f"cannot create bag '{self.path}': {exc}") from exc
        self._writer = writer
        return self

    def add_topic(
        self,
        topic: str,
        typename: str,
        qos_profiles: str | list = "",
        *,
        msgdef: str | None = None,
        type_hash: str | None = None,
    ) -> None:
        """Declare a topic before writing to it.

        `qos_profiles` is the offered QoS as rosbag2 stores it (the YAML text
        of a list of profiles, or that list); "" for none. The definition and
        RIHS01 hash come from the interface registry unless both are given
        (for types the registry does not know).
        """
        writer = self._require_open()
        _check_topic_name(topic)
        typename = _message_typename(typename) if msgdef is None or type_hash is None else typename
        if topic in self._typenames:
            if self._typenames[topic] != typename:
                raise BagError(f"topic '{topic}' was added as {self._typenames[topic]}, not {typename}")
            return
        if msgdef is None or type_hash is None:
            msgdef, type_hash = registry().msgdef(typename), registry().type_hash(typename)
        conn = writer.add_connection(
            topic, typename, msgdef=msgdef, rihs01=type_hash, offered_qos_profiles=_parse_qos(topic, qos_profiles)
        )
        self._connections[topic] = conn
        self._typenames[topic] = typename

    def write(self, topic: str, timestamp_ns: int, data: bytes | bytearray | memoryview) -> None:
        """Append one serialized message received at `timestamp_ns` (ns since the epoch)."""
        writer = self._require_open()
        conn = self._connections.get(topic)
        if conn is None:
            raise BagError(f"cannot write to unknown topic '{topic}'; call add_topic first")
        if isinstance(timestamp_ns, bool) or not isinstance(timestamp_ns, int) or timestamp_ns < 0:
            raise BagError(f"timestamp_ns must be a non-negative int (ns), got {timestamp_ns!r}")
        if not isinstance(data, (bytes, memoryview)):
            data = bytes(data)
        writer.write(conn, timestamp_ns, data)
        self.message_count += 1

    def close(self) -> None:
        """Finish the storage file and write metadata.yaml; closing twice is harmless."""
        writer, self._writer = self._writer, None
        if writer is None:
            return
        if self.message_count == 0:
            writer.min_timestamp = 0  # rosbags would record 2**63-1 as an empty bag's start time
        writer.close()

    def _require_open(self) -> Writer:
        if self._writer is None:
            raise BagError(f"bag '{self.path}' is not open (use it in a with block or call open())")
        return self._writer

    def __enter__(self) -> BagWriter:
        return self.open()

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _check_topic_name(topic: str) -> None:
    if not isinstance(topic, str) or not topic.startswith("/") or (topic.endswith("/") and topic != "/"):
        raise BagError(f"topic name must be absolute like '/ns/name', got {topic!r}")


def _message_typename(typename: str) -> str:
    try:
        return registry().check_message(typename)
    except InterfaceError as exc:
        raise BagError(str(exc)) from exc


def _parse_qos(topic: str, qos_profiles: str | list) -> list:
    try:
        return parse_qos(qos_profiles)
    except (ReaderError, KeyError, TypeError) as exc:
        raise BagError(f"topic '{topic}': cannot read qos_profiles ({type(exc).__name__}: {exc})") from exc


# ===================================================== reading: storage files
@dataclass
class _Topic:
    """A topic as one storage file or metadata.yaml describes it."""

    name: str
    type: str
    serialization_format: str
    qos: str = ""
    count: int = 0


@dataclass
class _Stats:
    topics: list[_Topic]
    start_ns: int
    end_ns: int
    count: int


class _McapFile:
    """One `.mcap` storage file; the summary section is read (and checked) on open."""

    storage_id = "mcap"

    def __init__(self, path: Path):
        self.path = path
        with path.open("rb") as stream:
            _check_mcap_ends(path, stream)
            self.stats = self._guard(lambda: self._read_stats(stream))

    def _read_stats(self, stream: Any) -> _Stats:
        summary = make_reader(stream).get_summary()
        if summary is None or summary.statistics is None:
            return self._scan_stats(stream)
        st = summary.statistics
        topics = [
            self._topic(channel, summary.schemas.get(channel.schema_id), st.channel_message_counts.get(cid, 0))
            for cid, channel in sorted(summary.channels.items())
        ]
        if st.message_count == 0:
            return _Stats(topics, 0, 0, 0)
        return _Stats(topics, st.message_start_time, st.message_end_time, st.message_count)

    def _scan_stats(self, stream: Any) -> _Stats:
        """Statistics by reading every record (for files written without a summary)."""
        stream.seek(0)
        schemas: dict[int, Schema] = {}
        channels: dict[int, Channel] = {}
        counts: dict[int, int] = {}
        start, end = math.inf, -math.inf
        for record in StreamReader(stream).records:
            if isinstance(record, Schema):
                schemas[record.id] = record
            elif isinstance(record, Channel):
                channels[record.id] = record
            elif isinstance(record, Message):
                counts[record.channel_id] = counts.get(record.channel_id, 0) + 1
                start, end = min(start, record.log_time), max(end, record.log_time)
        topics = [
            self._topic(channel, schemas.get(channel.schema_id), counts.get(cid, 0))
            for cid, channel in sorted(channels.items())
        ]
        total = sum(counts.values())
        return _Stats(topics, int(start) if total else 0, int(end) if total else 0, total)

    @staticmethod
    def _topic(channel: Channel, schema: Schema | None, count: int) -> _Topic:
        qos = channel.metadata.get("offered_qos_profiles", "")
        return _Topic(channel.topic, schema.name if schema else "", channel.message_encoding, qos, count)

    def messages(self, names: set[str] | None, start_ns: int | None) -> Iterator[BagMessage]:
        """Messages in log-time order, optionally only some topics and from `start_ns` on."""
        with self.path.open("rb") as stream:
            reader = make_reader(stream, validate_crcs=True)
            items = reader.iter_messages(topics=names, starting_at=start_ns, log_time_order=True)
            while True:
                item = self._guard(lambda: next(items, None))
                if item is None:
                    return
                schema, channel, message = item
                yield BagMessage(channel.topic, schema.name if schema else "", message.log_time, message.data)

    def _guard(self, step: Callable[[], Any]) -> Any:
        try:
            return step()
        except Exception as exc:  # noqa: BLE001 - the mcap package reports damage as
            # McapError, struct.error, EOFError, zlib/zstandard/lz4 errors, ...; all mean the same here.
            raise BagError(f"corrupted MCAP file '{self.path}': {type(exc).__name__}: {exc}") from exc


def _check_mcap_ends(path: Path, stream: Any) -> None:
    """An MCAP file starts and ends with the magic; a missing end means it was cut off."""
    if stream.read(len(MCAP_MAGIC)) != MCAP_MAGIC:
        raise BagError(f"'{path}' is not an MCAP file (bad magic)")
    size = stream.seek(0, 2)
    if size < 2 * len(MCAP_MAGIC) + 1:
        raise BagError(f"truncated MCAP file '{path}' ({size} bytes)")
    stream.seek(-len(MCAP_MAGIC), 2)
    if stream.read(len(MCAP_MAGIC)) != MCAP_MAGIC:
        raise BagError(
            f"truncated MCAP file '{path}': no footer (recording interrupted? try `ros2 bag reindex`)"
        )
    stream.seek(0)


class _Sqlite3File:
    """One `.db3` storage file (rosbag2's sqlite3 plugin, any schema version)."""

    storage_id = "sqlite3"

    def __init__(self, path: Path):
        self.path = path
        with self._connect() as conn:
            self._topics = self._guard(lambda: self._read_topics(conn))
        self._stats: _Stats | None = None

    def _connect(self) -> _ClosingConnection:
        uri = f"{self.path.resolve().as_uri()}?mode=ro"
        try:
            return _ClosingConnection(sqlite3.connect(uri, uri=True))
        except sqlite3.Error as exc:
            raise BagError(f"cannot open SQLite3 bag '{self.path}': {exc}") from exc

    def _read_topics(self, conn: sqlite3.Connection) -> dict[int, _Topic]:
        tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if not {"topics", "messages"} <= tables:
            raise BagError(f"'{self.path}' is an SQLite3 file but not a rosbag2 bag (no topics/messages tables)")
        columns = {row[1] for row in conn.execute("PRAGMA table_info(topics)")}
        qos = "offered_qos_profiles" if "offered_qos_profiles" in columns else "''"
        rows = conn.execute(f"SELECT id, name, type, serialization_format, {qos} FROM topics ORDER BY id")
        return {tid: _Topic(name, typ, fmt, qos_text or "") for tid, name, typ, fmt, qos_text in rows}

    @property
    def stats(self) -> _Stats:
        """Counts and time range; computed on first use (a scan of the messages table)."""
        if self._stats is None:
            with self._connect() as conn:
                self._stats = self._guard(lambda: self._read_stats(conn))
        return self._stats

    def _read_stats(self, conn: sqlite3.Connection) -> _Stats:
        counts = dict(conn.execute("SELECT topic_id, COUNT(*) FROM messages GROUP BY topic_id"))
        start, end, total = conn.execute("SELECT MIN(timestamp), MAX(timestamp), COUNT(*) FROM messages").fetchone()
        topics = [
            _Topic(t.name, t.type, t.serialization_format, t.qos, counts.get(tid, 0)) for tid, t in self._topics.items()
        ]
        return _Stats(topics, start or 0, end or 0, total)

    def messages(self, names: set[str] | None, start_ns: int | None) -> Iterator[BagMessage]:
        """Messages in timestamp order (insertion order among equal timestamps)."""
        wanted = {tid: t for tid, t in self._topics.items() if names is None or t.name in names}
        if not wanted:
            return
        marks = ",".join("?" * len(wanted))
        query = f"SELECT topic_id, timestamp, data FROM messages WHERE topic_id IN ({marks})"
        args: list[int] = list(wanted)
        if start_ns is not None:
            query += " AND timestamp >= ?"
            args.append(start_ns)
        with self._connect() as conn:
            rows = self._guard(lambda: conn.execute(query + " ORDER BY timestamp, id", args))
            while True:
                row = self._guard(rows.fetchone)
                if row is None:
                    return
                topic = wanted[row[0]]
                yield BagMessage(topic.name, topic.type, row[1], bytes(row[2]))

    def _guard(self, step: Callable[[], Any]) -> Any:
        try:
            return step()
        except sqlite3.Error as exc:
            raise BagError(f"corrupted SQLite3 bag '{self.path}': {exc}") from exc


class _ClosingConnection:
    """`with` for sqlite3 connections that closes them (sqlite3's own only commits)."""

    def __init__(self, conn: sqlite3.Connection):
        self.conn = conn

    def __enter__(self) -> sqlite3.Connection:
        return self.conn

    def __exit__(self, *exc_info: object) -> None:
        self.conn.close()


def _open_storage_file(path: Path) -> _McapFile | _Sqlite3File:
    """Open a storage file by its content (the suffix may lie)."""
    if not path.is_file():
        raise BagError(f"bag file '{path}' does not exist")
    try:
        with path.open("rb") as stream:
            head = stream.read(len(SQLITE_MAGIC))
    except OSError as exc:
        raise BagError(f"cannot read bag file '{path}': {exc.strerror or exc}") from exc
    if head.startswith(MCAP_MAGIC):
        return _McapFile(path)
    if head == SQLITE_MAGIC:
        return _Sqlite3File(path)
    if path.name.endswith((".zstd", ".zst")):
        raise BagError(f"'{path}' is file-compressed; decompress it first (e.g. `zstd -d`)")
    if not head:
        raise BagError(f"'{path}' is empty, not a bag file")
    raise BagError(f"'{path}' is not a bag file (neither MCAP nor SQLite3)")


# ========================================================= reading: metadata
def _load_metadata(directory: Path) -> dict | None:
    """The `rosbag2_bagfile_information` mapping of metadata.yaml, or None without one."""
    path = directory / "metadata.yaml"
    if not path.is_file():
        return None
    try:
        doc = yaml.safe_load(path.read_text())
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise BagError(f"'{path}' is not valid YAML: {str(exc).splitlines()[0]}") from exc
    info = doc.get("rosbag2_bagfile_information") if isinstance(doc, dict) else None
    if not isinstance(info, dict):
        raise BagError(f"'{path}' is not rosbag2 metadata (no rosbag2_bagfile_information)")
    return info


def _storage_paths(directory: Path, meta: dict | None) -> list[Path]:
    """The storage files of a bag directory: those metadata.yaml lists, else those present."""
    if meta and meta.get("relative_file_paths"):
        return [_resolve_listed(directory, rel) for rel in meta["relative_file_paths"]]
    found = sorted(p for p in directory.iterdir() if p.suffix in _STORAGE_SUFFIXES and p.is_file())
    if not found:
        raise BagError(f"'{directory}' is not a bag: no metadata.yaml and no .mcap or .db3 file")
    return found


def _resolve_listed(directory: Path, rel: str) -> Path:
    # Bags before metadata version 4 list paths relative to the bag's parent.
    for candidate in (directory / rel, directory.parent / rel, directory / Path(rel).name):
        if candidate.is_file():
            return candidate
    raise BagError(f"'{directory}/metadata.yaml' lists '{rel}', which does not exist")


def _metadata_stats(meta: dict) -> _Stats | None:
    """Counts and time range as metadata.yaml records them (what `ros2 bag info` shows)."""
    try:
        topics = [_metadata_topic(entry) for entry in meta.get("topics_with_message_count") or []]
        count = int(meta["message_count"])
        start = int(meta["starting_time"]["nanoseconds_since_epoch"])
        duration = int(meta["duration"]["nanoseconds"])
    except (KeyError, TypeError, ValueError):
        return None  # incomplete metadata: fall back to the storage files
    if count == 0:
        return _Stats(topics, 0, 0, 0)
    return _Stats(topics, start, start + duration, count)


def _metadata_topic(entry: dict) -> _Topic:
    tm = entry["topic_metadata"]
    qos = tm.get("offered_qos_profiles") or ""
    if not isinstance(qos, str):  # metadata version 9 stores a list
        qos = yaml.safe_dump(qos, sort_keys=False).strip()
    return _Topic(tm["name"], tm["type"], tm.get("serialization_format", "cdr"), qos, int(entry["message_count"]))


def _merge_stats(parts: list[_Stats]) -> _Stats:
    """Combine per-file statistics of a split bag; topics merge by (name, type)."""
    topics: dict[tuple[str, str], _Topic] = {}
    for part in parts:
        for t in part.topics:
            key = (t.name, t.type)
            if key in topics:
                topics[key].count += t.count
            else:
                topics[key] = _Topic(t.name, t.type, t.serialization_format, t.qos, t.count)
    full = [p for p in parts if p.count]
    if not full:
        return _Stats(list(topics.values()), 0, 0, 0)
    return _Stats(
        list(topics.values()), min(p.start_ns for p in full), max(p.end_ns for p in full), sum(p.count for p in full)
    )


# ============================================================ reading: bags
class BagReader:
    """Read a rosbag2 bag: a directory, or a single `.mcap` / `.db3` file.

    Counts and times come from metadata.yaml when the bag has one (as
    `ros2 bag info` reports them), else from the storage files. Iterating
    yields `BagMessage`s in timestamp order; each iteration reopens the
    files, so a reader can be iterated again (for looped playback).
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)
        if not self.path.exists():
            raise BagError(f"bag '{self.path}' does not exist")
        meta = _load_metadata(self.path) if self.path.is_dir() else None
        paths = _storage_paths(self.path, meta) if self.path.is_dir() else [self.path]
        self._files = [_open_storage_file(p) for p in paths]
        self._compression = _compression(meta)
        self.storage_id: str = (meta or {}).get("storage_identifier") or self._files[0].storage_id
        stats = _metadata_stats(meta) if meta else None
        self._stats = stats or _merge_stats([f.stats for f in self._files])

    # ------------------------------------------------------------ summary
    @property
    def files(self) -> list[Path]:
        return [f.path for f in self._files]

    @property
    def size_bytes(self) -> int:
        return sum(p.stat().st_size for p in self.files)

    @property
    def start_ns(self) -> int:
        return self._stats.start_ns

    @property
    def end_ns(self) -> int:
        return self._stats.end_ns

    @property
    def duration_ns(self) -> int:
        return self._stats.end_ns - self._stats.start_ns

    @property
    def message_count(self) -> int:
        return self._stats.count

    def topics(self) -> list[TopicInfo]:
        """Every topic in the bag, including topics without messages."""
        return [TopicInfo(t.name, t.type, t.count, t.serialization_format) for t in self._stats.topics]

    def offered_qos(self, topic: str) -> str:
        """The offered QoS profiles recorded for `topic` (YAML text, "" if none)."""
        for t in self._stats.topics:
            if t.name == topic:
                return t.qos
        raise BagError(f"topic '{topic}' is not in bag '{self.path}'")

    # ----------------------------------------------------------- messages
    def messages(self, topics: Iterable[str] | None = None, start_ns: int | None = None) -> Iterator[BagMessage]:
        """Messages in timestamp order, optionally only `topics` and from `start_ns` on."""
        names = None if topics is None else set(topics)
        streams = [f.messages(names, start_ns) for f in self._files]
        merged = streams[0] if len(streams) == 1 else heapq.merge(*streams, key=lambda m: m.timestamp_ns)
        if self._compression is None:
            return merged
        return (m._replace(data=self._compression(m.data)) for m in merged)

    def __iter__(self) -> Iterator[BagMessage]:
        return self.messages()

    def __enter__(self) -> BagReader:
        return self

    def __exit__(self, *exc_info: object) -> None:
        pass  # files are opened per iteration and closed when it ends


def _compression(meta: dict | None) -> Callable[[bytes], bytes] | None:
    """A per-message decompressor for message-compressed bags; None when uncompressed."""
    mode = ((meta or {}).get("compression_mode") or "").lower()
    fmt = ((meta or {}).get("compression_format") or "").lower()
    if mode in ("", "none"):
        return None
    if mode == "message" and fmt == "zstd":
        try:
            from compression import zstd  # Python >= 3.14
        except ImportError:
            from backports import zstd  # installed with rosbags
        return zstd.decompress
    raise BagError(f"unsupported bag compression (mode '{mode}', format '{fmt}'); decompress the bag first")


# ===================================================================== info
def info(path: str | Path) -> dict:
    """A summary of the bag at `path` as plain data (for `bag info`, JSON or YAML)."""
    reader = BagReader(path)
    return {
        "path": str(reader.path),
        "files": [p.name for p in reader.files],
        "size_bytes": reader.size_bytes,
        "storage_id": reader.storage_id,
        "start_ns": reader.start_ns,
        "end_ns": reader.end_ns,
        "duration_ns": reader.duration_ns,
        "message_count": reader.message_count,
        "topics": [t._asdict() for t in reader.topics()],
    }


def format_info(summary: dict) -> str:
    """Render `info()` output the way `ros2 bag info` prints it."""
    label = "{:<19}".format
    files = summary["files"] or [""]
    lines = [label("Files:") + files[0]] + [label("") + f for f in files[1:]]
    lines += [
        label("Bag size:") + _format_size(summary["size_bytes"]),
        label("Storage id:") + summary["storage_id"],
        label("Duration:") + f"{summary['duration_ns'] / 1e9:.9f}s",
        label("Start:") + _format_time(summary["start_ns"]),
        label("End:") + _format_time(summary["end_ns"]),
        label("Messages:") + str(summary["message_count"]),
    ]
    topics = [
        f"Topic: {t['name']} | Type: {t['type']} | Count: {t['count']} | "
        f"Serialization Format: {t['serialization_format']}"
        for t in summary["topics"]
    ] or [""]
    lines += [label("Topic information:") + topics[0]] + [label("") + t for t in topics[1:]]
    return "\n".join(lines)


def _format_size(size: int) -> str:
    units = ["B", "KiB", "MiB", "GiB", "TiB"]
    value, unit = float(size), 0
    while value >= 1024 and unit < len(units) - 1:
        value, unit = value / 1024, unit + 1
    return f"{size} B" if unit == 0 else f"{value:.1f} {units[unit]}"


def _format_time(ns: int) -> str:
    sec, nsec = divmod(ns, 1_000_000_000)
    local = datetime.datetime.fromtimestamp(sec)
    return f"{local:%b} {local.day:2d} {local:%Y %H:%M:%S}.{nsec:09d} ({sec}.{nsec:09d})"


# ===================================================================== play
def play(
    reader: BagReader,
    publish: Callable[[str, str, bytes], Any],
    *,
    rate: float = 1.0,
    start_offset_s: float = 0.0,
    topics: Iterable[str] | None = None,
    loop: bool = False,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], Any] | None = None,
    stop: threading.Event | None = None,
    clock_hz: float = 0.0,
    publish_clock: Callable[[int], Any] | None = None,
) -> int:
    """Publish a bag's messages with their recorded timing; return how many were published.

    The bag's timeline starts at `reader.start_ns + start_offset_s` and runs
    `rate` times faster than recorded (rate=2: half the gaps). Each message is
    due at (t_msg - t_origin) / rate after playback started; waiting targets
    that instant on `clock`, so time spent in `publish` does not accumulate.
    `stop` is checked before each message and after each wait. `sleep`
    defaults to `stop.wait` (a set event cuts a long gap short), or to
    `time.sleep` without an event. With `loop`, playback restarts until
    stopped.

    With `clock_hz` > 0, `publish_clock(ns)` is called every 1/clock_hz s of
    playback, from its start to its last message, with the bag time of the
    playback position (t_origin + elapsed * rate): what `ros2 bag play --clock`
    publishes on /clock (rosgraph_msgs/Clock, 40 Hz by default there), the time
    a node with `use_sim_time` runs on.
    """
    if not (isinstance(rate, (int, float)) and math.isfinite(rate) and rate > 0):
        raise BagError(f"rate must be a positive number, got {rate!r}")
    if not (isinstance(start_offset_s, (int, float)) and math.isfinite(start_offset_s) and start_offset_s >= 0):
        raise BagError(f"start_offset_s must be >= 0, got {start_offset_s!r}")
    if not (isinstance(clock_hz, (int, float)) and math.isfinite(clock_hz) and clock_hz >= 0):
        raise BagError(f"clock_hz must be a positive number (0: no clock), got {clock_hz!r}")
    if clock_hz and publish_clock is None:
        raise BagError("clock_hz needs publish_clock")
    selected = _select_topics(reader, topics)
    wait = sleep or (stop.wait if stop is not None else time.sleep)
    origin_ns = reader.start_ns + round(start_offset_s * 1e9)
    published = 0
    while True:
        ticks = _ClockTicks(publish_clock, clock_hz, origin_ns, rate) if clock_hz and publish_clock else None
        count = _play_once(reader, publish, selected, origin_ns, rate, clock, wait, stop, ticks)
        published += count
        if not loop or count == 0 or _is_set(stop):
            return published


def require_topics(reader: BagReader, required: Mapping[str, str | None]) -> None:
    """Fail unless the bag has messages on every topic of `required` (topic -> type name, or None
    for any type), before anything is played: the BagError names each topic missing, empty or of
    another type, and the topics the bag has."""
    have = {t.name: t for t in reader.topics()}
    problems = []
    for topic, typename in required.items():
        wanted = _full_name(typename) if typename else None
        shown = f"{topic} ({wanted})" if wanted else topic
        found = have.get(topic)
        if found is None:
            problems.append(f"no {shown}")
        elif wanted and found.type != wanted:
            problems.append(f"{topic} as {found.type}, not {wanted}")
        elif found.count == 0:
            problems.append(f"no messages on {shown}")
    if problems:
        listed = ", ".join(f"{t.name} ({t.type}, {t.count} messages)" for t in have.values()) or "none"
        raise BagError(f"bag '{reader.path}' has {'; '.join(problems)}; its topics: {listed}")


def _select_topics(reader: BagReader, topics: Iterable[str] | None) -> set[str] | None:
    if topics is None:
        return None
    wanted = {topics} if isinstance(topics, str) else set(topics)
    missing = wanted - {t.name for t in reader.topics()}
    if missing:
        raise BagError(f"topic(s) not in bag '{reader.path}': {', '.join(sorted(missing))}")
    return wanted


def _play_once(
    reader: BagReader,
    publish: Callable[[str, str, bytes], Any],
    topics: set[str] | None,
    origin_ns: int,
    rate: float,
    clock: Callable[[], float],
    wait: Callable[[float], Any],
    stop: threading.Event | None,
    ticks: _ClockTicks | None = None,
) -> int:
    """One pass over the bag; returns the number of messages published."""
    started = clock()
    count = 0
    for msg in reader.messages(topics, start_ns=origin_ns):
        if _is_set(stop):
            break
        due = (msg.timestamp_ns - origin_ns) / 1e9 / rate
        while True:  # until the message is due, the clock's ticks on their own times
            elapsed = clock() - started
            if ticks is not None:
                ticks.publish_due(elapsed)
            remaining = due - elapsed
            if remaining <= 0:
                break
            step = remaining if ticks is None else min(remaining, max(0.0, ticks.next_s - elapsed))
            wait(step)
            if _is_set(stop):
                return count
            if step >= remaining:  # waited until the message is due
                break
        publish(msg.topic, msg.typename, msg.data)
        count += 1
    return count


class _ClockTicks:
    """`--clock`: the bag time of the playback position, every 1/hz s of playback (the first at its start)."""

    def __init__(self, publish: Callable[[int], Any], hz: float, origin_ns: int, rate: float) -> None:
        self.publish, self.period_s, self.origin_ns, self.rate = publish, 1.0 / hz, origin_ns, rate
        self.next_s = 0.0  # playback seconds of the next tick

    def publish_due(self, elapsed_s: float) -> None:
        if elapsed_s < self.next_s - 1e-9:  # a clock that stops a rounding error short is there
            return
        self.publish(self.origin_ns + round(elapsed_s * self.rate * 1e9))
        skipped = max(0, math.floor((elapsed_s - self.next_s) / self.period_s))  # after a slow publish, no burst
        self.next_s += (skipped + 1) * self.period_s


def _is_set(stop: threading.Event | None) -> bool:
    return stop is not None and stop.is_set()


# =================================================================== record
class Recorder:
    """A thread-safe sink for live messages: adds each topic on first sight and writes.

    Subscription callbacks from any thread call `on_message`; without a
    timestamp the receive time (`clock_ns`, ns since the epoch) is used, as
    rosbag2 records receive time.
    """

    def __init__(self, writer: BagWriter, clock_ns: Callable[[], int] = time.time_ns):
        self._writer = writer
        self._clock_ns = clock_ns
        self._lock = threading.Lock()
        self._count = 0

    @property
    def count(self) -> int:
        """Messages written so far."""
        return self._count

    def on_message(
        self,
        topic: str,
        typename: str,
        data: bytes | bytearray | memoryview,
        timestamp_ns: int | None = None,
        qos_profiles: str | list = "",
    ) -> None:
        """Record one message; `qos_profiles` is used when the topic is first seen."""
        stamp = self._clock_ns() if timestamp_ns is None else timestamp_ns
        with self._lock:
            known = self._writer.topics.get(topic)
            if known is None:
                self._writer.add_topic(topic, typename, qos_profiles)
            elif known != _full_name(typename):
                raise BagError(f"topic '{topic}' is recorded as {known}; got a {typename} message")
            self._writer.write(topic, stamp, data)
            self._count += 1


def _full_name(typename: str) -> str:
    try:
        return normalize_name(typename, "msg")
    except InterfaceError as exc:
        raise BagError(str(exc)) from exc
