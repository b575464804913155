"""The interface files parse into types with ROS-exact hashes and exact CDR round trips."""

import numpy as np
import pytest
from support import REPO

from edge_llm_ros.runtime.interfaces import InterfaceError, Registry, registry

# Hashes published in rmw_zenoh's design document for real ROS 2 types.
KNOWN = {
    "std_msgs/msg/String": "RIHS01_df668c740482bbd48fb39d76a70dfd4bd59db1288021743503259e948f6b1a18",
    # rosidl's (Jazzy) for the vendored unitree_api, so machines without ROS 2 check them too (test_ros2 compares all)
    "unitree_api/msg/Request": "RIHS01_60dda80d19538b06c8f79b77222b1b7642dd753b8439a6bd535ff0cba08c5378",
    "unitree_api/msg/Response": "RIHS01_5300d019bb652073e7248995c878765c68ab519bcbdbad2e2a17c81abd8888b9",
}
ADD_TWO_INTS = "RIHS01_e118de6bf5eeb66a2491b5bda11202e7b68f198d6f67922cf30364858239c81a"


def test_known_message_hash():
    for name, value in KNOWN.items():
        assert registry().type_hash(name) == value


def test_service_hash_composition_matches_ros():
    reg = Registry()
    reg._register_service("example_interfaces/srv/AddTwoInts", "int64 a\nint64 b\n", "int64 sum\n", "test")
    assert reg.type_hash("example_interfaces/srv/AddTwoInts") == ADD_TWO_INTS


def test_every_package_interface_is_registered():
    reg = registry()
    for name in ["DraftTree", "HiddenStates", "VerifyResult", "PruneInfo", "Plan", "InferenceStats", "NavAction", "TokenChunk"]:
        assert reg.check_message(f"edge_llm_ros/msg/{name}") == f"edge_llm_ros/msg/{name}"
        assert reg.type_hash(f"edge_llm_ros/msg/{name}").startswith("RIHS01_")
    assert reg.service("edge_llm_ros/srv/Profile").request == "edge_llm_ros/srv/Profile_Request"
    assert reg.service("edge_llm_ros/Plan").response == "edge_llm_ros/srv/Plan_Response"
    act = reg.action("edge_llm_ros/action/Generate")
    goal_fields = [f for f, _ in reg.store.fielddefs[act.goal][1]]
    assert goal_fields == ["prompt", "images", "max_new_tokens", "temperature", "top_k", "top_p", "seed", "stop", "choices", "mode"]


UNITREE_API = {  # unitreerobotics/unitree_ros2 cyclonedds_ws/src/unitree/unitree_api/msg: the wire contract
    "Request": "RequestHeader header; string parameter; uint8[] binary",
    "RequestHeader": "RequestIdentity identity; RequestLease lease; RequestPolicy policy",
    "RequestIdentity": "int64 id; int64 api_id", "RequestLease": "int64 id",
    "RequestPolicy": "int32 priority; bool noreply",
    "Response": "ResponseHeader header; string data; int8[] binary",
    "ResponseHeader": "RequestIdentity identity; ResponseStatus status", "ResponseStatus": "int32 code",
}


def test_the_vendored_unitree_api_has_unitree_ros2s_fields_and_round_trips():
    reg = registry()
    for name, fields in UNITREE_API.items():
        defined = (REPO / "interfaces" / "unitree_api" / "msg" / f"{name}.msg").read_text().split("\n")
        assert "; ".join(" ".join(line.split()) for line in defined if line.strip()) == fields, name
        assert [f for f, _ in reg.store.fielddefs[f"unitree_api/msg/{name}"][1]] == [
            field.split()[1] for field in fields.split("; ")]
    msg = reg.new("unitree_api/msg/Request", parameter='{"x": 0.5, "y": 0.0, "z": 0.0}', binary=[1, 2])
    msg.header.identity.api_id, msg.header.identity.id = 1008, 2 ** 40
    back = reg.deserialize(reg.serialize(msg), "unitree_api/msg/Request")
    assert reg.to_dict(back) == reg.to_dict(msg) and back.header.identity.api_id == 1008


def test_defaults_and_roundtrip_with_arrays():
    reg = registry()
    msg = reg.new("edge_llm_ros/msg/DraftTree", request_id="r1", round=3, token_ids=[5, 6, 7], parents=[-1, 0, 0],
                  draft_probs=np.array([0.5, 0.25, 0.125], dtype=np.float32))
    assert msg.token_ids.dtype == np.int32 and msg.topk == 0 and msg.header.frame_id == ""
    back = reg.deserialize(reg.serialize(msg), "edge_llm_ros/msg/DraftTree")
    assert reg.to_dict(back) == reg.to_dict(msg)


def test_from_dict_errors_name_the_field():
    reg = registry()
    with pytest.raises(InterfaceError, match="no field"):
        reg.from_dict("std_msgs/msg/String", {"text": "x"})
    with pytest.raises(InterfaceError, match="round"):
        reg.from_dict("edge_llm_ros/msg/TokenChunk", {"round": "many"})
    with pytest.raises(InterfaceError, match="unknown message type"):
        reg.check_message("edge_llm_ros/msg/NoSuchThing")
    with pytest.raises(TypeError, match="no field"):
        reg.new("std_msgs/msg/String", dta="x")


# ------------------------------------------------------------- value ranges
INT_EDGES = [
    ("Int8", -128, 127), ("Int16", -32768, 32767), ("Int32", -2**31, 2**31 - 1), ("Int64", -2**63, 2**63 - 1),
    ("UInt8", 0, 255), ("UInt16", 0, 65535), ("UInt32", 0, 2**32 - 1), ("UInt64", 0, 2**64 - 1),
    ("Byte", 0, 255), ("Char", 0, 255),
]


@pytest.mark.parametrize("short, lo, hi", INT_EDGES)
def test_from_dict_takes_integers_at_their_range_edges_and_refuses_one_past(short, lo, hi):
    reg = registry()
    name = f"std_msgs/msg/{short}"
    for value in (lo, hi):
        msg = reg.from_dict(name, {"data": value})
        reg.serialize(msg)
    for value in (lo - 1, hi + 1):
        with pytest.raises(InterfaceError) as err:
            reg.from_dict(name, {"data": value})
        assert str(err.value).startswith(f"{name}.data: {value} is out of range for ")
        assert str(err.value).endswith(f" [{lo}, {hi}]")


def test_from_dict_out_of_range_message_is_exact():
    with pytest.raises(InterfaceError) as err:
        registry().from_dict("std_msgs/msg/Int32", {"data": 99999999999})
    assert str(err.value) == "std_msgs/msg/Int32.data: 99999999999 is out of range for int32 [-2147483648, 2147483647]"


def test_byte_is_an_octet_on_the_wire():
    reg = registry()
    data = reg.serialize(reg.from_dict("std_msgs/msg/Byte", {"data": 200}))
    assert data[4] == 200  # after the 4-byte CDR header


@pytest.mark.parametrize("name, values, message", [
    ("std_msgs/msg/UInt32", {"data": -3}, "std_msgs/msg/UInt32.data: -3 is out of range for uint32 [0, 4294967295]"),
    ("edge_llm_ros/action/Generate_Goal", {"prompt": "hi", "max_new_tokens": -3},
     "edge_llm_ros/action/Generate_Goal.max_new_tokens: -3 is out of range for uint32 [0, 4294967295]"),
    ("std_msgs/msg/Float32", {"data": 1e40},
     "std_msgs/msg/Float32.data: 1e+40 is out of range for float32 [-3.4028234663852886e+38, 3.4028234663852886e+38]"),
    ("std_msgs/msg/Float32", {"data": "-1e39"}, "std_msgs/msg/Float32.data: -1e39 is out of range for float32"),
    ("std_msgs/msg/Float64", {"data": 10**400}, "std_msgs/msg/Float64.data: a 401-digit integer is out of range"),
    ("std_msgs/msg/Bool", {"data": "yes"}, "std_msgs/msg/Bool.data: 'yes' is not a bool (true/false or 1/0)"),
    ("std_msgs/msg/Bool", {"data": 2}, "std_msgs/msg/Bool.data: 2 is not a bool"),
    ("std_msgs/msg/Bool", {"data": 0.5}, "std_msgs/msg/Bool.data: 0.5 is not a bool"),
    ("std_msgs/msg/Int32", {"data": "many"}, "std_msgs/msg/Int32.data: expected a number (int32), got 'many'"),
    ("std_msgs/msg/Int32", {"data": 1.5}, "std_msgs/msg/Int32.data: 1.5 is not an integer (int32)"),
    ("std_msgs/msg/Int32", {"data": True}, "std_msgs/msg/Int32.data: expected a number (int32), got True"),
    ("std_msgs/msg/Int32", {"data": None}, "std_msgs/msg/Int32.data: expected a value of type int32, got None"),
    ("std_msgs/msg/Int32", {"data": [1]}, "std_msgs/msg/Int32.data: expected a value of type int32, got [1]"),
    ("std_msgs/msg/Float64", {"data": "fast"}, "std_msgs/msg/Float64.data: expected a number (float64), got 'fast'"),
    ("std_msgs/msg/UInt8MultiArray", {"data": [1, 2, 300]},
     "std_msgs/msg/UInt8MultiArray.data[2]: 300 is out of range for uint8 [0, 255]"),
    ("std_msgs/msg/Int32MultiArray", {"data": [1, 2.5]}, "std_msgs/msg/Int32MultiArray.data[1]: 2.5 is not an integer"),
    ("std_msgs/msg/Int32MultiArray", {"data": 5}, "std_msgs/msg/Int32MultiArray.data: expected a list, got 5"),
    ("std_msgs/msg/Float32MultiArray", {"data": [0.5, 1e39]}, "std_msgs/msg/Float32MultiArray.data[1]: 1e+39 is out of range"),
    ("std_msgs/msg/ByteMultiArray", {"data": [255, -1]}, "std_msgs/msg/ByteMultiArray.data[1]: -1 is out of range for byte"),
    ("std_msgs/msg/Int32MultiArray", {"layout": {"dim": [{"label": "x", "size": -1}]}},
     "std_msgs/msg/Int32MultiArray.layout.dim[0].size: -1 is out of range for uint32"),
    ("edge_llm_ros/msg/DraftTree", {"header": {"stamp": {"sec": 2**31}}},
     "edge_llm_ros/msg/DraftTree.header.stamp.sec: 2147483648 is out of range for int32"),
    ("geometry_msgs/msg/PoseWithCovariance", {"covariance": [0.0] * 35},
     "geometry_msgs/msg/PoseWithCovariance.covariance: expected 36 elements, got 35"),
    ("unique_identifier_msgs/msg/UUID", {"uuid": [0] * 15 + [256]},
     "unique_identifier_msgs/msg/UUID.uuid[15]: 256 is out of range for uint8 [0, 255]"),
    ("edge_llm_ros/srv/Profile_Event", {"request": [{}, {}]},
     "edge_llm_ros/srv/Profile_Event.request: 2 elements, more than its bound of 1"),
])
def test_from_dict_refuses_values_that_do_not_fit_naming_the_field(name, values, message):
    with pytest.raises(InterfaceError) as err:
        registry().from_dict(name, values)
    assert str(err.value).startswith(message), str(err.value)


def test_from_dict_takes_ieee_specials_bool_spellings_and_numeric_strings():
    reg = registry()
    specials = reg.from_dict("std_msgs/msg/Float32MultiArray", {"data": [float("nan"), "inf", "-inf", 3.4028234e38]})
    assert np.isnan(specials.data[0]) and list(specials.data[1:3]) == [np.inf, -np.inf]
    reg.serialize(specials)
    for given, expected in ((True, True), (False, False), (1, True), (0, False), ("true", True), ("False", False)):
        assert reg.from_dict("std_msgs/msg/Bool", {"data": given}).data is expected
    assert reg.from_dict("std_msgs/msg/Int64", {"data": "12"}).data == 12
    assert reg.from_dict("std_msgs/msg/Int32", {"data": 4.0}).data == 4


@pytest.mark.parametrize("same_value_cast", [True, False], ids=["numpy-cast-check", "min-max-check"])
def test_array_fields_refuse_what_numpy_would_wrap_or_truncate(monkeypatch, same_value_cast):
    from edge_llm_ros.runtime import values

    if same_value_cast and not values._SAME_VALUE_CAST:
        pytest.skip("numpy < 2.4 has no same_value cast")
    monkeypatch.setattr(values, "_SAME_VALUE_CAST", same_value_cast)
    reg = registry()
    draft = "edge_llm_ros/msg/DraftTree"
    refused = [
        ({"token_ids": [1, 2**31]}, "token_ids[1]: 2147483648 is out of range for int32"),
        ({"token_ids": np.array([5, 2**40])}, "token_ids[1]: 1099511627776 is out of range for int32"),
        ({"token_ids": [1, 2.5]}, "token_ids[1]: 2.5 is not an integer"),
        ({"token_ids": [float("nan")]}, "token_ids[0]: nan is not an integer"),
        ({"token_ids": [2**70]}, "token_ids[0]: 1180591620717411303424 is out of range for int32"),
        ({"token_ids": ["a"]}, "token_ids[0]: expected a number (int32), got 'a'"),
        ({"draft_probs": [0.5, 1e39]}, "draft_probs[1]: 1e+39 is out of range for float32"),
        ({"token_ids": [[1], [2, 3]]}, "token_ids: cannot make an array of int32"),
    ]
    for fields, message in refused:
        with pytest.raises(InterfaceError) as err:
            reg.new(draft, **fields)
        assert str(err.value).startswith(f"{draft}.{message}"), str(err.value)
    with pytest.raises(InterfaceError, match=r"UInt64MultiArray.data\[0\]: -1 is out of range for uint64"):
        reg.new("std_msgs/msg/UInt64MultiArray", data=np.array([-1]))
    with pytest.raises(InterfaceError, match=r"Int64MultiArray.data\[0\]: 18446744073709551615 is out of range"):
        reg.new("std_msgs/msg/Int64MultiArray", data=np.array([2**64 - 1], dtype=np.uint64))
    taken = reg.new(draft, token_ids=[1.0, -2.0], draft_probs=[float("nan"), np.inf, 0.25], parents=np.array([-1, 0]))
    assert taken.token_ids.tolist() == [1, -2] and taken.parents.dtype == np.int32
    assert np.isnan(taken.draft_probs[0]) and taken.draft_probs[1] == np.inf and taken.draft_probs.dtype == np.float32
    assert reg.new("std_msgs/msg/UInt64MultiArray", data=[2**64 - 1]).data.tolist() == [2**64 - 1]


def test_serialize_names_the_field_a_node_set_out_of_range():
    reg = registry()
    draft = "edge_llm_ros/msg/DraftTree"

    def serialize_with(**fields):
        msg = reg.new(draft)
        for fname, value in fields.items():
            setattr(msg, fname, value)
        with pytest.raises(InterfaceError) as err:
            reg.serialize(msg)
        return str(err.value)

    assert serialize_with(round=-1) == f"{draft}.round: -1 is out of range for uint32 [0, 4294967295]"
    assert serialize_with(temperature=np.float64(1e40)).startswith(f"{draft}.temperature: 1e+40 is out of range for float32")
    assert serialize_with(top_k=2.5) == f"{draft}.top_k: expected a value of type uint32, got 2.5"
    assert serialize_with(request_id=7) == f"{draft}.request_id: expected a string, got 7"
    assert serialize_with(header=None) == f"{draft}.header: expected a std_msgs/msg/Header message, got None"
    msg = reg.new(draft)
    msg.header.stamp.sec = 2**31
    with pytest.raises(InterfaceError, match=r"DraftTree.header.stamp.sec: 2147483648 is out of range for int32"):
        reg.serialize(msg)
    statuses = reg.new("action_msgs/msg/GoalStatusArray", status_list=[reg.new("action_msgs/msg/GoalStatus", status=300)])
    with pytest.raises(InterfaceError, match=r"status_list\[0\].status: 300 is out of range for int8 \[-128, 127\]"):
        reg.serialize(statuses)
    received = reg.deserialize(reg.serialize(reg.new(draft)), draft)  # rosbags' own class: no coercion on assignment
    received.token_ids = [1, 2]
    with pytest.raises(InterfaceError, match=r"DraftTree.token_ids: expected a numpy array of int32, got \[1, 2\]"):
        reg.serialize(received)


def test_request_status_codes_are_the_messages_constants():
    """edge_llm_ros.errors.Status mirrors msg/RequestStatus.msg, name for name and value for value."""
    from edge_llm_ros.errors import Status

    msgdef = registry().msgdef("edge_llm_ros/msg/RequestStatus")
    constants = {}
    for line in msgdef.splitlines():
        code = line.split("#")[0].split()
        if len(code) == 2 and "=" in code[1]:
            name, value = code[1].split("=")
            constants[name] = int(value)
    assert constants == {s.name: s.value for s in Status}
