"""Where a navigation decision runs, and how long it takes there: on the robot, on a server over a
link (cloud AR), or split (edge-cloud speculative: the draft on the robot, the target verifying on
the server, EE §4.4). Knows nothing about ROS.

Contract: a decision's compute is measured (``Navigator.decide``: seconds, verification rounds);
`NavDeployment.decision_s` adds what the link costs, from the link's round-trip time and rate:

    robot          compute
    cloud AR       frame up (bytes / rate) + one round trip (the instruction and frame up, the
                   answer down) + compute on the server
    edge-cloud     frame up (both models condition on it) + one round trip per verification
                   round + compute (draft on the robot, verification on the server)

The server's compute is taken as this device's (the only one measured): on this machine the
server is the robot's twin, so cloud AR can only add the link. `plan` picks the deployment with
the shortest predicted decision.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

IMAGE_HEADER_BYTES = 64  # sensor_msgs/Image without its data (header, sizes, encoding), CDR


@dataclass(frozen=True)
class Link:
    rtt_s: float = 0.05
    bandwidth_bps: float = 100e6  # bits per second

    def __post_init__(self) -> None:
        if self.rtt_s < 0 or self.bandwidth_bps <= 0:
            raise ValueError(f"a link needs rtt >= 0 and bandwidth > 0, got {self.rtt_s} s, {self.bandwidth_bps} bit/s")

    def transfer_s(self, nbytes: int) -> float:
        return 8 * nbytes / self.bandwidth_bps


@dataclass(frozen=True)
class NavDeployment:
    name: str
    mode: str  # the decoding mode (lossless: every deployment gives the same answer)
    target_on: str  # robot | server
    what: str

    def decision_s(self, compute_s: float, rounds: int, frame_bytes: int, link: Link) -> float:
        if self.target_on == "robot":
            return compute_s
        up = link.transfer_s(frame_bytes + IMAGE_HEADER_BYTES)
        if self.mode == "ar":
            return up + link.rtt_s + compute_s
        return up + max(rounds, 1) * link.rtt_s + compute_s


DEPLOYMENTS = {d.name: d for d in (
    NavDeployment("robot-ar", "ar", "robot", "target on the robot, autoregressive"),
    NavDeployment("robot-sd", "sd", "robot", "draft and target on the robot, speculative"),
    NavDeployment("cloud-ar", "ar", "server", "target on the server, autoregressive; frames over the link"),
    NavDeployment("edge-cloud-sd", "sd", "server", "draft on the robot, target verifying on the server (EE)"),
)}


def plan(predicted_s: Mapping[str, float]) -> str:
    """The deployment with the shortest predicted decision (the first of a tie, in the given order)."""
    if not predicted_s:
        raise ValueError("no deployment to plan from")
    return min(predicted_s, key=lambda name: predicted_s[name])
