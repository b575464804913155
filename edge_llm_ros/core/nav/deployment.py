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

:class:`Regime` projects a decision's tokens and verification rounds onto another deployment's
seconds (simulated, not measured): :data:`EE_GO2` is EE's own Go2 deployment (Table 8: a Jetson
Orin drafting with Qwen2-VL-2B, an A100 verifying with Qwen2-VL-7B over Wi-Fi 6), where a
verification takes 0.6 s and speculation can beat cloud AR.
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


@dataclass(frozen=True)
class Regime:
    """Seconds of another deployment, each cited (``sources``), onto which a decision's tokens and
    verification rounds are projected:

        cloud AR     tokens x ar_token_s (cloud AR's latency per token, its link included)
        edge-cloud   rounds x (draft_round_s + link_s + verify_s) (EE's round: gamma T_p + T_c + T_q)

    A deployment with the target on the robot has no projection (None): the regime's target does
    not fit the robot."""

    name: str
    draft_round_s: float
    verify_s: float
    link_s: float
    ar_token_s: float
    gamma: int
    sources: tuple[str, ...]

    def decision_s(self, deployment: NavDeployment, tokens: int, rounds: int) -> float | None:
        if deployment.target_on == "robot":
            return None
        if deployment.mode == "ar":
            return tokens * self.ar_token_s
        return max(rounds, 1) * (self.draft_round_s + self.link_s + self.verify_s)


def _ee_go2() -> Regime:
    draft, verify, link, tau, ar_over_sd, gamma = 0.288, 0.620, 0.120, 2.92, 0.90, 4
    sd_token = (draft + link + verify) / tau
    return Regime(
        "EE's Go2 deployment (Jetson Orin + Qwen2-VL-2B drafting, A100 + Qwen2-VL-7B verifying, Wi-Fi 6)",
        draft_round_s=draft, verify_s=verify, link_s=link, ar_token_s=ar_over_sd * sd_token, gamma=gamma,
        sources=(
            f"drafting gamma T_p = {draft * 1e3:.0f} ms at gamma = {gamma}, verification T_q = {verify * 1e3:.0f} ms, "
            f"communication T_c = {link * 1e3:.0f} ms: edge_cloud_early_exit.txt Table 8(a)",
            f"tau = {tau}, speedup AR -> SD = {ar_over_sd}x: edge_cloud_early_exit.txt Table 8(b)",
            f"cloud AR per token = {ar_over_sd} x SD's per token = {ar_over_sd} x (T_p gamma + T_c + T_q) / tau = "
            f"{ar_over_sd * sd_token * 1e3:.0f} ms (derived: the speedup is a ratio of latencies per token)",
        ))


EE_GO2 = _ee_go2()
