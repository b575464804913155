"""Where a navigation decision runs: on the robot, on a server over a link (cloud AR), or split
(edge-cloud speculative: the draft on the robot, the target verifying on the server, EE §4.4,
with pre-drafting from early exits in fsd and ee). Knows nothing about ROS.

Contract: with the VLM, a decision's time is measured where it runs (``bench --scenario nav``: the
robot's half and the server's on their own threads, every message over an emulated link).
`NavDeployment.modelled_s` is what a model-free decision (the camera expert, a fixed compute time)
costs over the link instead, from its round-trip time and rate:

    robot          compute
    cloud AR       frame up (bytes / rate) + one round trip + compute on the server
    edge-cloud     frame up + one round trip per verification round + compute

`plan` picks the deployment with the shortest predicted decision.

:func:`ee_go2_costs` are the seconds of EE's own Go2 deployment (Table 8: a Jetson Orin drafting
with Qwen2-VL-2B, an A100 verifying with Qwen2-VL-7B), for core/sim/edge_cloud.py to project a
decision's real tokens, acceptance and early outcomes onto (simulated, not measured): there a
verification takes 0.6 s and speculation can beat cloud AR.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from edge_llm_ros.core.planning.costs import Cited
from edge_llm_ros.core.planning.costs import Link as SimLink
from edge_llm_ros.core.sim.edge_cloud import EdgeCloudCosts

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

    def modelled_s(self, compute_s: float, rounds: int, frame_bytes: int, link: Link) -> float:
        if self.target_on == "robot":
            return compute_s
        up = link.transfer_s(frame_bytes + IMAGE_HEADER_BYTES)
        if self.mode == "ar":
            return up + link.rtt_s + compute_s
        return up + max(rounds, 1) * link.rtt_s + compute_s


DEPLOYMENTS = {d.name: d for d in (
    NavDeployment("robot-ar", "ar", "robot", "target on the robot, autoregressive"),
    NavDeployment("robot-sd", "sd", "robot", "draft and target on the robot, speculative"),
    NavDeployment("cloud-ar", "ar", "server", "target on the server, autoregressive; the robot sends the frame's "
                                              "encoder features"),
    NavDeployment("edge-cloud-sd", "sd", "server", "draft on the robot, target verifying on the server (EE's SD)"),
    NavDeployment("edge-cloud-fsd", "fsd", "server", "as edge-cloud-sd, pre-drafting from the server's early exits "
                                                     "(EE's FSD)"),
    NavDeployment("edge-cloud-ee", "ee", "server", "as edge-cloud-fsd, finished pre-drafts sent ahead"),
)}


def plan(predicted_s: Mapping[str, float]) -> str:
    """The deployment with the shortest predicted decision (the first of a tie, in the given order)."""
    if not predicted_s:
        raise ValueError("no deployment to plan from")
    return min(predicted_s, key=lambda name: predicted_s[name])


# EE's Go2 deployment, Table 8 and the models' shapes
EE_GAMMA = 4
_T_P, _T_Q, _T_C, _TAU, _AR_OVER_SD = 0.288 / EE_GAMMA, 0.620, 0.120, 2.92, 0.90
_QWEN2_VL_7B = {"hidden": 3584, "intermediate": 18944, "vocab": 152064, "kv": 512}  # 4 KV heads of 128


def ee_go2_costs(layers: int) -> tuple[EdgeCloudCosts, list[Cited]]:
    """core/sim/edge_cloud.py's costs for EE's Go2 deployment, spread over a target of ``layers``
    layers, and every input cited. A verification of ``rows`` tree rows: T_q at gamma + 1 rows and
    more (a prompt's prefill: the layers' share of T_q, once more), at one row cloud AR's seconds
    per token, which Table 8(b) gives as a ratio to SD's (AR -> SD 0.90x at tau 2.92 with Table 4's
    SD latency), linear between; the head weighs as Qwen2-VL-7B's."""
    h, m, v, kv = (_QWEN2_VL_7B[k] for k in ("hidden", "intermediate", "vocab", "kv"))
    head_layers = v * h / (2 * h * h + 2 * h * kv + 3 * h * m)
    sd_token = (2 * _T_C + EE_GAMMA * _T_P + _T_Q) / _TAU
    one_row = _AR_OVER_SD * sd_token
    full = EE_GAMMA + 1

    def verify_s(rows: int) -> float:
        return one_row + (_T_Q - one_row) * (min(rows, full) - 1) / (full - 1)

    costs = EdgeCloudCosts.tabled(verify_s, layers, head_layers, _T_P, SimLink(_T_C, 100e6))
    table = "edge_cloud_early_exit.txt Table 8(a), Jetson Orin + Qwen2-VL-2B / A100 + Qwen2-VL-7B"
    inputs = [
        Cited("drafting latency gamma T_p, gamma = 4", _T_P * EE_GAMMA * 1e3, "ms", table),
        Cited("verification latency T_q (gamma + 1 rows)", _T_Q * 1e3, "ms", table),
        Cited("communication latency T_c, one way (Table 4 counts 2 T_c a round)", _T_C * 1e3, "ms", table),
        Cited("tau, AR -> SD speedup", _TAU, f"tokens a round, {_AR_OVER_SD}x",
              "edge_cloud_early_exit.txt Table 8(b)"),
        Cited("a one-row verification (cloud AR's seconds per token)", one_row * 1e3, "ms",
              f"derived: {_AR_OVER_SD} x SD's (2 T_c + gamma T_p + T_q) / tau (Table 4), the speedup being a ratio "
              "of latencies per token"),
        Cited("Qwen2-VL-7B's head over one layer", head_layers, "layers",
              f"the model's config (hidden {h}, MLP {m}, vocabulary {v}, 4 KV heads of 128): vocab x hidden / "
              "(2 h^2 + 2 h kv + 3 h m)"),
        Cited("a verification of more than gamma + 1 rows (a prompt's prefill: the layers' share)", _T_Q * 1e3, "ms",
              "an assumption: a GPU keeps its time flat over a few hundred rows (Ghidorah §III-C2)"),
        Cited("bandwidth", 100, "Mbit/s", "an assumption (the paper gives none; round 0 carries 2 kB of features)"),
    ]
    return costs, inputs
