"""The embedded backend's wire, held to rmw_zenoh's literal formats.

The reference is rmw_zenoh's design document, docs/design.md in ros2/rmw_zenoh (the 2025 text, on
zenoh-cpp), sections "Topic and Service name mapping to Zenoh key expressions", "Graph Cache",
"Publishers", "Service Clients" and "Service Servers". The literals below are its examples, copied.
They hold for the Jazzy release from 0.2.4 (April 2025) on. That release changed the attachment
from labelled fields to the positional layout quoted here (rmw_zenoh #601, backported as #605), so
0.2.0-0.2.3 do not talk to it.

On the observing side there is only a raw eclipse-zenoh session, with no project code. Real
embedded nodes (their own Zenoh sessions, in this process or as processes) make publishers,
subscriptions, services and clients. The raw session reads what those nodes put on the wire, and
the test compares it with the document. CDR and attachments are encoded and decoded here by hand
(struct), and checked against zenoh's own serializer: rmw_zenoh_cpp writes attachments with
zenoh-cpp's ext::Serializer, and eclipse-zenoh's zenoh.ext is the same format.
"""

from __future__ import annotations

import json
import struct
import threading
import time

import pytest
import zenoh
from support import Proc, python_module, wait_until
from zenoh.ext import Int64, z_deserialize, z_serialize

from edge_llm_ros.runtime import embedded
from edge_llm_ros.runtime.interfaces import registry

WAIT_S = 30.0  # for anything to cross the router on 2 busy cores

# ----------------------------------------------------------------- the document's literals
# "Topic and Service name mapping to Zenoh key expressions":
#   `<domain_id>/<fully_qualified_name>/<type_name>/<type_hash>`
# "* `chatter` topic (with `ROS_DOMAIN_ID=0` by default):"
CHATTER_KEY = "0/chatter/std_msgs::msg::dds_::String_/RIHS01_df668c740482bbd48fb39d76a70dfd4bd59db1288021743503259e948f6b1a18"
# "* `chatter` topic, using `/robot1` as a namespace:"
CHATTER_KEY_ROBOT1 = (
    "0/robot1/chatter/std_msgs::msg::dds_::String_/RIHS01_df668c740482bbd48fb39d76a70dfd4bd59db1288021743503259e948f6b1a18")
# "* `add_two_ints` service with `DOMAIN_ID=2`:"
ADD_TWO_INTS_KEY = ("2/add_two_ints/example_interfaces::srv::dds_::AddTwoInts_/"
                    "RIHS01_e118de6bf5eeb66a2491b5bda11202e7b68f198d6f67922cf30364858239c81a")

# "Graph Cache":
#   @ros2_lv/<domain_id>/<session_id>/<node_id>/<node_id>/<entity_kind>/<mangled_enclave>/<mangled_namespace>/<node_name>
#   @ros2_lv/<domain_id>/<session_id>/<node_id>/<entity_id>/<entity_kind>/<mangled_enclave>/<mangled_namespace>/
#       <node_name>/<mangled_qualified_name>/<type_name>/<type_hash>/<qos>
# "Examples using the demo_nodes_cpp package:" (they say ROS_DOMAIN_ID=0 but carry 2; 2 it is)
# "* `listener` node"
LISTENER_NN = "@ros2_lv/2/aac3178e146ba6f1fc6e6a4085e77f21/0/0/NN/%/%/listener"
# "* `listener` node's subscription on `chatter` topic"
LISTENER_MS = ("@ros2_lv/2/aac3178e146ba6f1fc6e6a4085e77f21/0/10/MS/%/%/listener/%chatter/std_msgs::msg::dds_::String_/"
               "RIHS01_df668c740482bbd48fb39d76a70dfd4bd59db1288021743503259e948f6b1a18/::,10:,:,:,,")
# "* `talker` node's publisher on `chatter` topic"
TALKER_MP = ("@ros2_lv/2/8b20917502ee955ac4476e0266340d5c/0/10/MP/%/%/talker/%chatter/std_msgs::msg::dds_::String_/"
             "RIHS01_df668c740482bbd48fb39d76a70dfd4bd59db1288021743503259e948f6b1a18/::,7:,:,:,,")
# "* `add_two_ints_server` node's service server"
SERVER_SS = ("@ros2_lv/2/f9980ee0495eaafb3e38f0d19e2eae12/0/10/SS/%/%/add_two_ints_server/%add_two_ints/"
             "example_interfaces::srv::dds_::AddTwoInts_/"
             "RIHS01_e118de6bf5eeb66a2491b5bda11202e7b68f198d6f67922cf30364858239c81a/::,10:,:,:,,")
# "* `add_two_ints_client` node's service client"
CLIENT_SC = ("@ros2_lv/2/e1dc8d1b45ae8717fce78689cc655685/0/10/SC/%/%/add_two_ints_client/%add_two_ints/"
             "example_interfaces::srv::dds_::AddTwoInts_/"
             "RIHS01_e118de6bf5eeb66a2491b5bda11202e7b68f198d6f67922cf30364858239c81a/::,10:,:,:,,")

# "Publishers" (and the same for a client's request and a server's reply):
#   "an attachment containing a sequence number, a source timestamp and publisher GID. It is encoded as such:
#     * 8 bytes for the sequence number (int64_t), encoded as a little-endian
#     * 8 bytes for the timestamp (number of ns since UNIX EPOCH as int64_t), encoded as a little-endian
#     * 1 byte for the length of the publisher GID (currently always 16)
#     * 16 bytes for the publisher GID (array of 16 int8_t)"
ATTACHMENT = struct.Struct("<qqB")
GID_LEN = 16
# A token's fields, split at '/': [2] session id, [3] node id, [4] entity id, [5] kind, [8] node name.
ZID, NID, EID, KIND, NODE = 2, 3, 4, 5, 8
STRING_TYPE = "std_msgs::msg::dds_::String_"
STRING_HASH = CHATTER_KEY.rsplit("/", 1)[1]


# ----------------------------------------------------------------- CDR and attachments by hand
CDR_LE = b"\x00\x01\x00\x00"  # encapsulation header: plain CDR, little endian, no options


def cdr_string(text: str) -> bytes:
    """A std_msgs/String: the header, then a uint32 length counting the NUL, the bytes, the NUL."""
    data = text.encode() + b"\x00"
    return CDR_LE + struct.pack("<I", len(data)) + data


def read_cdr_string(payload: bytes) -> str:
    assert payload[:4] == CDR_LE, payload[:4]
    (length,) = struct.unpack_from("<I", payload, 4)
    data = payload[8:8 + length]
    assert len(data) == length and data.endswith(b"\x00"), payload
    return data[:-1].decode()


def cdr_int64s(*values: int) -> bytes:
    """AddTwoInts' request (a, b) or response (sum): int64s, 8-aligned from the end of the header."""
    return CDR_LE + struct.pack(f"<{len(values)}q", *values)


def read_cdr_int64s(payload: bytes, count: int) -> tuple[int, ...]:
    assert payload[:4] == CDR_LE, payload[:4]
    return struct.unpack_from(f"<{count}q", payload, 4)


def read_attachment(raw: bytes) -> tuple[int, int, bytes]:
    """(sequence number, source timestamp ns, gid) from the document's layout. Zenoh's own
    deserializer reads the same bytes (rmw_zenoh_cpp writes them with zenoh-cpp's ext::Serializer)."""
    assert len(raw) == ATTACHMENT.size + GID_LEN, raw
    seq, stamp_ns, gid_len = ATTACHMENT.unpack_from(raw)
    gid = raw[ATTACHMENT.size:]
    assert gid_len == GID_LEN
    assert z_deserialize(tuple[Int64, Int64, bytes], zenoh.ZBytes(raw)) == (seq, stamp_ns, gid)
    return seq, stamp_ns, gid


def make_attachment(seq: int, gid: bytes) -> bytes:
    """What rmw_zenoh_cpp sends, made the way it makes it (zenoh's serializer); it is the document's layout."""
    stamp_ns = time.time_ns()
    made = z_serialize((Int64(seq), Int64(stamp_ns), gid)).to_bytes()
    assert made == ATTACHMENT.pack(seq, stamp_ns, len(gid)) + gid
    return made


def per_run(literal: str, token: str) -> str:
    """The document's token with the fields that differ from run to run (session id, node id, entity id)
    taken from the observed ``token``; every other field stays the document's."""
    parts, seen = literal.split("/"), token.split("/")
    parts[ZID:EID + 1] = seen[ZID:EID + 1]
    return "/".join(parts)


# ----------------------------------------------------------------- fixtures
@pytest.fixture()
def raw(router_endpoint):
    """A plain eclipse-zenoh session at the test router, configured as rmw_zenoh's sessions are (peer,
    no multicast scouting), listening on loopback only."""
    conf = zenoh.Config()
    conf.insert_json5("mode", json.dumps("peer"))
    conf.insert_json5("connect/endpoints", json.dumps([router_endpoint]))
    conf.insert_json5("listen/endpoints", json.dumps(["tcp/127.0.0.1:0"]))
    conf.insert_json5("scouting/multicast/enabled", "false")
    session = zenoh.open(conf)
    yield session
    session.close()


@pytest.fixture()
def fresh(router_endpoint):
    """``fresh(domain_id)``: a new embedded context (its own Zenoh session, ids counted from 0) on that ROS
    domain, its callbacks run on a thread, closed at the end of the test."""
    made: list[tuple[embedded.Context, threading.Event, threading.Thread]] = []

    def make(domain_id: int) -> embedded.Context:
        ctx = embedded.Context(args=[], domain_id=domain_id)
        stop = threading.Event()

        def spin() -> None:
            while not stop.is_set() and ctx.ok():
                embedded.spin_once(0.1, ctx)

        thread = threading.Thread(target=spin, daemon=True, name=f"spin domain {domain_id}")
        thread.start()
        made.append((ctx, stop, thread))
        return ctx

    yield make
    for ctx, stop, thread in made:
        stop.set()
        ctx.close()
        thread.join(5)


@pytest.fixture()
def add_two_ints():
    """example_interfaces/srv/AddTwoInts, the document's service, in this process's registry (the
    package's interfaces do not include it)."""
    reg = registry()
    if "example_interfaces/srv/AddTwoInts" not in reg.services:
        reg._register_service("example_interfaces/srv/AddTwoInts", "int64 a\nint64 b\n", "int64 sum\n", __file__)
    return "example_interfaces/srv/AddTwoInts"


class Tokens:
    """Liveliness tokens as a raw session sees them: those alive now, and every PUT/DELETE in order."""

    def __init__(self, session: zenoh.Session, key: str) -> None:
        self.alive: set[str] = set()
        self.events: list[tuple[str, str]] = []
        self._cond = threading.Condition()
        self._sub = session.liveliness().declare_subscriber(key, self._on_sample, history=True)

    def _on_sample(self, sample: zenoh.Sample) -> None:
        key, put = str(sample.key_expr), sample.kind == zenoh.SampleKind.PUT
        with self._cond:
            self.events.append(("PUT" if put else "DELETE", key))
            (self.alive.add if put else self.alive.discard)(key)
            self._cond.notify_all()

    def one(self, zid: str, kind: str, node: str, timeout: float = WAIT_S) -> str:
        """The single live token of ``kind`` for node ``node`` of session ``zid``."""
        def found() -> list[str]:
            with self._cond:
                return [k for k in self.alive
                        if k.split("/")[ZID] == zid and k.split("/")[KIND] == kind and k.split("/")[NODE] == node]
        keys = wait_until(found, timeout, f"a {kind} token of {node} from {zid}")
        assert len(keys) == 1, keys
        return keys[0]

    def wait_deleted(self, key: str, timeout: float = WAIT_S) -> None:
        wait_until(lambda: ("DELETE", key) in self.events, timeout, f"{key} deleted")

    def undeclare(self) -> None:
        self._sub.undeclare()


class Heard:
    """Samples a raw subscriber got: (key, payload, attachment), in order."""

    def __init__(self, session: zenoh.Session, key: str) -> None:
        self.samples: list[tuple[str, bytes, bytes | None]] = []
        self._lock = threading.Lock()
        self.sub = session.declare_subscriber(key, self._on_sample)

    def _on_sample(self, sample: zenoh.Sample) -> None:
        attachment = sample.attachment.to_bytes() if sample.attachment is not None else None
        with self._lock:
            self.samples.append((str(sample.key_expr), sample.payload.to_bytes(), attachment))

    def wait_for(self, count: int, what: str) -> list[tuple[str, bytes, bytes | None]]:
        def enough() -> list | None:
            with self._lock:
                return list(self.samples) if len(self.samples) >= count else None
        return wait_until(enough, WAIT_S, what)


def session_zid(ctx: embedded.Context) -> str:
    """The session id as zenoh itself prints it (rmw_zenoh_cpp's tokens carry `zid.to_string()`)."""
    return str(ctx.session.info.zid())


def ask(session: zenoh.Session, key: str, payload: bytes, attachment: bytes) -> zenoh.Sample:
    """The first reply to a raw query on ``key``, asking again until one comes: a server's token can reach
    the raw session before its queryable's declaration does, and a query that meets no queryable ends at once."""
    def reply() -> zenoh.Sample | None:
        for answer in session.get(key, payload=payload, attachment=attachment, target=zenoh.QueryTarget.ALL_COMPLETE,
                                  timeout=WAIT_S):
            assert answer.ok is not None, answer.err.payload.to_bytes()
            return answer.ok
        return None
    return wait_until(reply, WAIT_S, f"a reply on {key}")


def wait_peer(raw_session: zenoh.Session, zid: str) -> None:
    """The raw session knows the embedded one as a peer by that id (rmw_zenoh's sessions connect peer to peer)."""
    wait_until(lambda: zid in {str(z) for z in raw_session.info.peers_zid()}, WAIT_S, f"peer {zid}")


# ----------------------------------------------------------------- key expressions
def test_topic_and_service_keys_are_the_documents_examples(fresh, raw, add_two_ints):
    reg = registry()
    ctx0, ctx2 = fresh(0), fresh(2)
    heard = Heard(raw, "0/**")
    talker = embedded.Node("talker", context=ctx0)
    robot1 = embedded.Node("talker", namespace="/robot1", context=ctx0)
    for node, text in ((talker, "Hello World: 1"), (robot1, "Hello robot1: 1")):
        pub = node.create_publisher("std_msgs/msg/String", "chatter", 7)
        assert pub.wait_for_subscribers(WAIT_S), "the raw subscriber never matched"
        pub.publish(reg.new("std_msgs/msg/String", data=text))
    samples = heard.wait_for(2, "both chatter samples")
    assert [(key, read_cdr_string(payload)) for key, payload, _ in samples] == [
        (CHATTER_KEY, "Hello World: 1"), (CHATTER_KEY_ROBOT1, "Hello robot1: 1")]

    # the service's queryable answers a raw query on the document's key, and replies on that key
    server = embedded.Node("add_two_ints_server", context=ctx2)
    server.create_service(add_two_ints, "add_two_ints", lambda req, resp: (setattr(resp, "sum", req.a + req.b), resp)[1])
    tokens = Tokens(raw, "@ros2_lv/2/**")
    tokens.one(session_zid(ctx2), "SS", "add_two_ints_server")  # declared after the queryable
    reply = ask(raw, ADD_TWO_INTS_KEY, cdr_int64s(2, 3), make_attachment(1, bytes(range(16))))
    assert str(reply.key_expr) == ADD_TWO_INTS_KEY
    assert read_cdr_int64s(reply.payload.to_bytes(), 1) == (5,)
    tokens.undeclare()


# ----------------------------------------------------------------- liveliness tokens
def test_liveliness_tokens_are_the_documents_examples(fresh, raw, add_two_ints):
    ctx = fresh(2)
    zid = session_zid(ctx)
    tokens = Tokens(raw, "@ros2_lv/2/**")
    listener = embedded.Node("listener", context=ctx)
    listener.create_subscription("std_msgs/msg/String", "chatter", lambda msg: None, 10)
    talker = embedded.Node("talker", context=ctx)
    talker.create_publisher("std_msgs/msg/String", "chatter", 7)
    server = embedded.Node("add_two_ints_server", context=ctx)
    server.create_service(add_two_ints, "add_two_ints", lambda req, resp: resp)
    client = embedded.Node("add_two_ints_client", context=ctx)
    client.create_client(add_two_ints, "add_two_ints")
    wait_peer(raw, zid)

    nodes = {name: tokens.one(zid, "NN", name) for name in ("listener", "talker", "add_two_ints_server", "add_two_ints_client")}
    assert nodes["listener"] == per_run(LISTENER_NN, nodes["listener"])
    assert nodes["listener"].split("/")[ZID] == zid
    for name, literal in (("listener", LISTENER_MS), ("talker", TALKER_MP), ("add_two_ints_server", SERVER_SS),
                          ("add_two_ints_client", CLIENT_SC)):
        token = tokens.one(zid, literal.split("/")[KIND], name)
        assert token == per_run(literal, token)
        # the entity's node id is its node's; a node's token carries its id twice
        node_fields = nodes[name].split("/")
        assert token.split("/")[NID] == node_fields[NID] == node_fields[EID]
    # one counter over the context's nodes and entities, as rmw_zenoh_cpp's: no id twice in a session
    ids = [key.split("/")[EID] for key in tokens.alive if key.split("/")[ZID] == zid]
    assert len(ids) == 8 and len(set(ids)) == 8 and all(i.isdigit() for i in ids), ids

    # a destroyed entity's token leaves the graph: rmw_zenoh's peers see a DELETE
    publisher_token = tokens.one(zid, "MP", "talker")
    talker.destroy_node()
    tokens.wait_deleted(publisher_token)
    tokens.wait_deleted(nodes["talker"])
    tokens.undeclare()


def test_namespaces_and_qos_in_tokens_follow_the_documents_rules(fresh, raw):
    """Not among the examples, so built here from the document's rules: "A mangled name is the name with
    each `/` characters replaced by `%`", the namespace "just `%` if not set", and `<qos>` "encoded in a
    compact format (see the `qos_to_keyexpr` function)". rmw_zenoh_cpp's qos_to_keyexpr writes
    `<reliability>:<durability>:<history>,<depth>:<deadline s>,<ns>:<lifespan s>,<ns>:<liveliness>,<s>,<ns>`,
    each value an rmw enum (BEST_EFFORT 2, TRANSIENT_LOCAL 1) or number, empty where it equals its
    default (RELIABLE, VOLATILE, KEEP_LAST, depth 42, infinite durations, AUTOMATIC)."""
    ctx = fresh(2)
    zid = session_zid(ctx)
    tokens = Tokens(raw, "@ros2_lv/2/**")
    node = embedded.Node("listener", namespace="/robot1", context=ctx)
    node.create_subscription("std_msgs/msg/String", "chatter", lambda msg: None, 10)
    latched = node.create_publisher("std_msgs/msg/String", "/map_ready",
                                    embedded.QoSProfile(depth=5, reliable=False, transient_local=True))
    deep = embedded.Node("deep", namespace="/a/b", context=ctx)
    deep.create_publisher("std_msgs/msg/String", "c/d", 42)

    nn = tokens.one(zid, "NN", "listener")
    assert nn == f"@ros2_lv/2/{zid}/{nn.split('/')[NID]}/{nn.split('/')[NID]}/NN/%/%robot1/listener"
    ms = tokens.one(zid, "MS", "listener")
    assert ms == per_run(LISTENER_MS.replace("/%/%/listener/%chatter/", "/%/%robot1/listener/%robot1%chatter/"), ms)
    mp = tokens.one(zid, "MP", "listener")
    assert mp == per_run(TALKER_MP.replace("/%/%/talker/%chatter/", "/%/%robot1/listener/%map_ready/")
                         .replace("/::,7:,:,:,,", "/2:1:,5:,:,:,,"), mp)
    deep_mp = tokens.one(zid, "MP", "deep")
    assert deep_mp == per_run(TALKER_MP.replace("/%/%/talker/%chatter/", "/%/%a%b/deep/%a%b%c%d/")
                              .replace("/::,7:,:,:,,", "/::,:,:,:,,"), deep_mp)
    latched.destroy()
    tokens.wait_deleted(mp)
    tokens.undeclare()


# ----------------------------------------------------------------- attachments
def test_a_publishers_attachment_has_the_documents_layout(fresh, raw):
    reg = registry()
    ctx = fresh(2)
    key = f"2/wire/attachment/{STRING_TYPE}/{STRING_HASH}"
    heard = Heard(raw, key)
    first = embedded.Node("first", context=ctx).create_publisher("std_msgs/msg/String", "/wire/attachment", 10)
    second = embedded.Node("second", context=ctx).create_publisher("std_msgs/msg/String", "/wire/attachment", 10)
    assert first.wait_for_subscribers(WAIT_S) and second.wait_for_subscribers(WAIT_S)
    before_ns = time.time_ns()
    for i in range(5):
        first.publish(reg.new("std_msgs/msg/String", data=f"first {i}"))
    for i in range(3):
        second.publish(reg.new("std_msgs/msg/String", data=f"second {i}"))
    samples = heard.wait_for(8, "eight samples")
    after_ns = time.time_ns()

    by_publisher: dict[bytes, list[tuple[int, str]]] = {}
    for sample_key, payload, attachment in samples:
        assert sample_key == key and attachment is not None
        seq, stamp_ns, gid = read_attachment(attachment)
        assert before_ns <= stamp_ns <= after_ns  # the source timestamp: the system time as it was published
        by_publisher.setdefault(gid, []).append((seq, read_cdr_string(payload)))
    # a gid per publisher, the same on each of its samples; per publisher, sequence numbers counting by
    # one from 1 (rmw_zenoh_cpp's PublisherData starts its count at 1)
    assert sorted(by_publisher.values(), key=len) == [
        [(1, "second 0"), (2, "second 1"), (3, "second 2")],
        [(1, "first 0"), (2, "first 1"), (3, "first 2"), (4, "first 3"), (5, "first 4")]]


def test_service_request_and_reply_attachments_have_the_documents_layout(fresh, raw, add_two_ints):
    """A client's request carries its sequence number, a timestamp and its gid; the server's reply
    carries "the sequence number received in the request attachment, a source timestamp for the reply
    and the client GID received in the request attachment" (Service Servers). Both directions: an
    embedded client against a raw queryable, a raw client against an embedded server."""
    ctx = fresh(2)
    zid = session_zid(ctx)
    queries: list[tuple[tuple[int, ...], bytes]] = []

    def serve(query: zenoh.Query) -> None:  # a service server written from the document alone
        attachment = query.attachment.to_bytes()
        a, b = read_cdr_int64s(query.payload.to_bytes(), 2)
        queries.append(((a, b), attachment))
        seq, _stamp, gid = read_attachment(attachment)
        query.reply(query.key_expr, cdr_int64s(a + b), attachment=make_attachment(seq, gid))

    queryable = raw.declare_queryable(ADD_TWO_INTS_KEY, serve, complete=True)
    raw_zid = str(raw.info.zid())
    # the raw server's SS token, the document's example with this session's id: the embedded client
    # finds the service in the graph through it
    server_token = raw.liveliness().declare_token(SERVER_SS.replace(SERVER_SS.split("/")[ZID], raw_zid))
    node = embedded.Node("add_two_ints_client", context=ctx)
    client = node.create_client(add_two_ints, "add_two_ints")
    assert client.wait_for_service(WAIT_S), "the embedded client never saw the raw server's token"
    Request = registry().message_class("example_interfaces/srv/AddTwoInts_Request")
    before_ns = time.time_ns()
    sums = [client.call(Request(a=a, b=b), timeout_sec=WAIT_S).sum for a, b in ((2, 3), (40, 2))]
    after_ns = time.time_ns()
    assert sums == [5, 42]
    requests = [(args, read_attachment(attachment)) for args, attachment in queries]
    assert [(args, seq) for args, (seq, _, _) in requests] == [((2, 3), 1), ((40, 2), 2)]
    gids = {gid for _, (_, _, gid) in requests}
    assert len(gids) == 1  # the client's gid, the same on every request
    assert all(before_ns <= stamp <= after_ns for _, (_, stamp, _) in requests)
    server_token.undeclare()
    queryable.undeclare()

    # a raw client against an embedded server: the reply echoes the request's sequence number and gid
    server = embedded.Node("add_two_ints_server", context=ctx)
    server.create_service(add_two_ints, "add_two_ints", lambda req, resp: (setattr(resp, "sum", req.a + req.b), resp)[1])
    Tokens(raw, "@ros2_lv/2/**").one(zid, "SS", "add_two_ints_server")
    client_gid = bytes(range(100, 116))
    before_ns = time.time_ns()
    reply = ask(raw, ADD_TWO_INTS_KEY, cdr_int64s(20, 22), make_attachment(7, client_gid))
    after_ns = time.time_ns()
    assert read_cdr_int64s(reply.payload.to_bytes(), 1) == (42,)
    seq, stamp_ns, gid = read_attachment(reply.attachment.to_bytes())
    assert (seq, gid) == (7, client_gid) and before_ns <= stamp_ns <= after_ns


# ----------------------------------------------------------------- interop with node processes
def cli_node(domain_id: int, *args: str) -> Proc:
    """`edge-llm-ros ARGS` as a process: an embedded-backend node of its own on ``domain_id``."""
    return Proc(python_module("edge_llm_ros.cli", *args), env={"ROS_DOMAIN_ID": str(domain_id), "EDGE_LLM_BACKEND": "zenoh"})


@pytest.mark.slow  # a node process
@pytest.mark.timeout(180)
def test_a_raw_zenoh_publisher_in_rmw_zenohs_format_is_heard_by_a_node_process(raw):
    """A raw session behaves as an rmw_zenoh talker: its node and publisher tokens, its samples on the
    document's key with the document's attachment. `edge-llm-ros topic echo` (a node process) learns
    the topic's type from the raw token alone and prints the message."""
    domain, text = 5, "Hello from a raw zenoh session"
    zid = str(raw.info.zid())
    tokens = [raw.liveliness().declare_token(f"@ros2_lv/{domain}/{zid}/0/0/NN/%/%/raw_talker"),
              raw.liveliness().declare_token(f"@ros2_lv/{domain}/{zid}/0/10/MP/%/%/raw_talker/%wire_in/{STRING_TYPE}/"
                                             f"{STRING_HASH}/::,7:,:,:,,")]
    publisher = raw.declare_publisher(f"{domain}/wire_in/{STRING_TYPE}/{STRING_HASH}")
    echo = cli_node(domain, "topic", "echo", "/wire_in", "--once", "--wait", "120", "--timeout", "150")
    try:
        wait_until(lambda: publisher.matching_status.matching or echo.popen.poll() is not None, 150,
                   "topic echo's subscription")
        assert echo.popen.poll() is None, echo.output
        publisher.put(cdr_string(text), attachment=make_attachment(1, bytes(range(16))))
        echo.wait_for_line(f"data: {text}", 60)
        assert echo.wait(60) == 0, echo.output
    finally:
        echo.stop()
        for token in tokens:
            token.undeclare()
        publisher.undeclare()


@pytest.mark.slow  # a node process
@pytest.mark.timeout(180)
def test_a_node_process_publication_is_decoded_by_a_raw_session(raw):
    """`edge-llm-ros topic pub` (a node process) publishes three std_msgs/String; the raw session hears
    them on the document's key, decodes the CDR and the attachments, and reads the node's publisher
    token in the document's format."""
    domain, text = 6, "Hello from a node process"
    key = f"{domain}/wire_out/{STRING_TYPE}/{STRING_HASH}"
    heard = Heard(raw, key)
    tokens = Tokens(raw, f"@ros2_lv/{domain}/**")
    pub = cli_node(domain, "topic", "pub", "-t", "3", "-r", "20", "-w", "120", "/wire_out", "std_msgs/msg/String",
                   json.dumps({"data": text}))
    try:
        samples = heard.wait_for(3, "three samples from topic pub")
        assert pub.wait(60) == 0, pub.output
    finally:
        pub.stop()
    decoded = [(sample_key, read_cdr_string(payload), read_attachment(attachment)) for sample_key, payload, attachment in samples]
    assert [(k, data, seq) for k, data, (seq, _, _) in decoded] == [(key, text, 1), (key, text, 2), (key, text, 3)]
    assert len({gid for _, _, (_, _, gid) in decoded}) == 1
    node_name = f"_edge_llm_ros_cli_{pub.popen.pid}"
    mp = wait_until(lambda: next((k for kind, k in list(tokens.events) if kind == "PUT" and k.split("/")[KIND] == "MP"), None),
                    WAIT_S, "topic pub's publisher token")
    # the document's talker, on this domain, node and topic, with topic pub's depth of 10
    assert mp == per_run(TALKER_MP.replace("@ros2_lv/2/", f"@ros2_lv/{domain}/")
                         .replace("/%/%/talker/%chatter/", f"/%/%/{node_name}/%wire_out/")
                         .replace("/::,7:,:,:,,", "/::,10:,:,:,,"), mp)
    tokens.undeclare()

