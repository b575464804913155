"""The interface files parse into types with ROS-exact hashes and exact CDR round trips."""

import numpy as np
import pytest

from edge_llm_ros.runtime.interfaces import InterfaceError, Registry, registry

# Hashes published in rmw_zenoh's design document for real ROS 2 types.
KNOWN = {
    "std_msgs/msg/String": "RIHS01_df668c740482bbd48fb39d76a70dfd4bd59db1288021743503259e948f6b1a18",
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
