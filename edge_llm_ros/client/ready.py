"""Readiness from the lifecycle state, not from a log line: a managed node (serve_node, draft_node,
verifier_node, stage_node, navigator_node) is ready when its ``get_state`` service
(lifecycle_msgs/srv/GetState, which rcl_lifecycle and the embedded runtime both serve) says
``active``. ``check`` (optional) runs on every look, so a caller can stop waiting at once when
what it launched has died.
"""

from __future__ import annotations

import time
from typing import Any, Callable

from edge_llm_ros.runtime.goals import NoAnswer

ACTIVE = 3  # lifecycle_msgs/msg/State.PRIMARY_STATE_ACTIVE
LOOK_S = 0.2  # between two looks
CALL_S = 5.0  # one get_state call at most
DISCOVERY_S = 1.0  # after its other services appear, how long a node's get_state may still be on its way


def tick(deadline: float, check: Callable[[], None] | None, why: str) -> None:
    """One pause of a wait: run ``check``, then NoAnswer(why) past ``deadline``, else sleep LOOK_S."""
    if check is not None:
        check()
    if time.monotonic() >= deadline:
        raise NoAnswer(why)
    time.sleep(LOOK_S)


def is_lifecycle_node(transport: Any, node: str, settle_s: float = DISCOVERY_S) -> bool:
    """Whether ``node`` (fully qualified) serves get_state, looking for up to ``settle_s``."""
    deadline = time.monotonic() + settle_s
    while node not in transport.servers_of(f"{node}/get_state"):
        if time.monotonic() >= deadline:
            return False
        time.sleep(LOOK_S / 2)
    return True


def wait_until_active(transport: Any, node: str, timeout: float, check: Callable[[], None] | None = None,
                      deadline: float | None = None) -> None:
    """Until ``node`` (fully qualified, e.g. /edge_llm/serve_node) is active; NoAnswer naming its
    state when it is not within ``timeout`` seconds (or by ``deadline``, a time.monotonic() of a
    wait that began earlier); a node that serves no get_state never is."""
    GetState = transport.service("lifecycle_msgs/srv/GetState")
    deadline = time.monotonic() + timeout if deadline is None else deadline
    label = "not there (no get_state service)"
    client = transport.node.create_client(GetState, f"{node}/get_state")
    try:
        while True:
            if client.service_is_ready():
                try:
                    state = transport.call(client, GetState.Request(), min(CALL_S, max(deadline - time.monotonic(), LOOK_S)))
                    if state.current_state.id == ACTIVE:
                        return
                    label = state.current_state.label or f"in state {state.current_state.id}"
                except TimeoutError:  # the node is busy or just leaving: look again
                    label = "not answering get_state"
            tick(deadline, check, f"{node} is {label}, not active, after {timeout:g} s")
    finally:
        transport.node.destroy_client(client)
