"""rmw_zenoh wire conventions: key expressions, liveliness tokens, attachments.

Builders come from zenoh-ros2-sdk (its `keyexpr`, `entity` and `attachment`
modules implement rmw_zenoh's design document); this module adds what the
SDK lacks for us: the QoS field of a token as rmw_zenoh_cpp writes it
(`qos_keyexpr`), parsing tokens back into a graph view (nodes, topics,
services with their types) and the action name layout.
test/runtime/test_rmw_zenoh_wire.py holds all of it to the document's literals.

    topic / service data key:  <domain>/<name without leading '/'>/<pkg::msg::dds_::Type_>/<RIHS01_hash>
    liveliness token:          @ros2_lv/<domain>/<zid>/<node id>/<entity id>/<NN|MP|MS|SS|SC>/<enclave>/
                               <namespace>/<node>[/<name>/<dds type>/<hash>/<qos>]   ('/' mangled to '%')
"""

from __future__ import annotations

from dataclasses import dataclass

from zenoh_ros2_sdk.attachment import Attachment
from zenoh_ros2_sdk.entity import EndpointEntity, EntityKind, NodeEntity
from zenoh_ros2_sdk.keyexpr import (
    ADMIN_SPACE,
    endpoint_liveliness_keyexpr,
    node_liveliness_keyexpr,
    topic_keyexpr,
)
from zenoh_ros2_sdk.utils import dds_to_ros_type, ros2_to_dds_type

__all__ = [
    "ADMIN_SPACE", "Attachment", "EndpointEntity", "EntityKind", "NodeEntity", "GraphEntry", "action_names",
    "data_key", "dds_to_ros_type", "endpoint_liveliness_keyexpr", "node_liveliness_keyexpr", "parse_token",
    "qos_keyexpr", "ros2_to_dds_type",
]

# Action components, as rcl_action names them under the action's name.
ACTION_SUFFIXES = {
    "send_goal": "/_action/send_goal",
    "cancel_goal": "/_action/cancel_goal",
    "get_result": "/_action/get_result",
    "feedback": "/_action/feedback",
    "status": "/_action/status",
}


def action_names(action_name: str) -> dict[str, str]:
    return {part: action_name + suffix for part, suffix in ACTION_SUFFIXES.items()}


def data_key(domain_id: int, name: str, ros_type: str, type_hash: str) -> str:
    return topic_keyexpr(domain_id, name, ros2_to_dds_type(ros_type), type_hash)


# rmw_zenoh_cpp's QoS defaults (src/detail/qos.cpp): RELIABLE, VOLATILE, KEEP_LAST, depth 42, infinite
# deadline and lifespan, AUTOMATIC liveliness with an infinite lease. A token leaves a field empty when
# the entity's value is the default.
RMW_ZENOH_DEFAULT_DEPTH = 42
RELIABILITY_BEST_EFFORT = 2  # rmw_qos_reliability_policy_e
DURABILITY_TRANSIENT_LOCAL = 1  # rmw_qos_durability_policy_e


def qos_keyexpr(reliable: bool, transient_local: bool, depth: int) -> str:
    """The QoS field of a liveliness token, as rmw_zenoh_cpp's qos_to_keyexpr writes it:

        <reliability>:<durability>:<history>,<depth>:<deadline s>,<ns>:<lifespan s>,<ns>:<liveliness>,<lease s>,<ns>

    each value as its rmw enum or number, empty where it is rmw_zenoh's default (history is always
    KEEP_LAST here; deadline, lifespan and liveliness always the defaults). A depth of 10 is
    `::,10:,:,:,,`, the document's example; a depth of 42 is `::,:,:,:,,`.
    """
    reliability = "" if reliable else str(RELIABILITY_BEST_EFFORT)
    durability = str(DURABILITY_TRANSIENT_LOCAL) if transient_local else ""
    history_depth = "" if depth == RMW_ZENOH_DEFAULT_DEPTH else str(depth)
    return f"{reliability}:{durability}:,{history_depth}:,:,:,,"


def _demangle(text: str) -> str:
    if text in ("", "%"):
        return "/"
    return text.replace("%", "/")


@dataclass(frozen=True)
class GraphEntry:
    """One liveliness token, parsed."""

    kind: str  # NN, MP, MS, SS, SC
    zid: str
    node_namespace: str
    node_name: str
    name: str = ""  # topic or service name (absolute)
    ros_type: str = ""
    type_hash: str = ""
    qos: str = ""

    @property
    def node_fqn(self) -> str:
        ns = self.node_namespace.rstrip("/")
        return f"{ns}/{self.node_name}"


def parse_token(key: str) -> GraphEntry | None:
    """Parse a liveliness token; None for anything that is not one of ours to read."""
    parts = key.split("/")
    if len(parts) < 9 or parts[0] != ADMIN_SPACE:
        return None
    kind = parts[5]
    namespace = _demangle(parts[7])
    if not namespace.startswith("/"):
        namespace = "/" + namespace
    node_name = _demangle(parts[8]).lstrip("/")
    if kind == EntityKind.NODE.value:
        return GraphEntry(kind, parts[2], namespace, node_name)
    if len(parts) < 13:
        return None
    name = _demangle(parts[9])
    if not name.startswith("/"):
        name = "/" + name
    return GraphEntry(kind, parts[2], namespace, node_name, name, dds_to_ros_type(parts[10]), parts[11], parts[12])
