"""Scoring deployments from a device's measurements: predicted tokens/s of every candidate, the winner, why.

Contract: :class:`Measurements` are what :mod:`.device_profile` measured (kept in the plan file:
row costs, tree costs, per draft its ms per token and τ per γ and per tree); :func:`choose` scores
one request on one device (what ``plan --device`` saves); :func:`plan_deployment` answers a
:class:`DeploymentRequest` (single device or edge-cloud, latency or throughput, n concurrent
requests) from the measurements alone, in milliseconds, measuring nothing. Every number it
returns is a prediction. Knows nothing about ROS.

The models (ms: ``cost(n)`` = the target's cost of n chain rows after a prefix, ``tree cost(W)``
that of a drafted tree of W nodes, ``d`` = the draft's ms per token; LLMCad §3.3, Ghidorah
§III-C: speculation pays only where verifying more rows is cheap for the hardware, else ``ar``):

* one request on this device: ``ar`` 1000 / cost(1); ``sd`` at γ 1000 τ(γ) / (cost(γ + 1) + γ d);
  ``tree`` 1000 τ(tree) / (tree cost(W) + the tree's draft ms);
* n concurrent requests (``aggregate``, all requests' tokens/s): on llama.cpp ``ar`` is served by
  continuous batching, n sequences' rows in one pass: n · 1000 / cost(n) (cost(n) of n chain rows
  stands for n sequences' rows; read off the measured curve, linear between and beyond its
  points); every other candidate serves one request at a time (speculative modes on llama.cpp)
  or interleaves them unbatched (torch), so its aggregate is its one-request speed. The
  ``latency`` objective predicts one request's share, aggregate / n;
* edge-cloud (the robot drafts, the server verifies; the server's costs are taken as this
  device's, the only ones measured): cloud decoding (``ar``: the server generates and streams)
  answers ANSWER_TOKENS tokens in 2L (the prompt up, the stream down: the link is paid once per
  answer) + N · max(cost(1), link time of a token's result); ``sd`` at γ makes τ(γ) tokens per
  round of γ d + 2L + link time of the draft and the result + cost(γ + 1) (``tree`` alike),
  where L is the one-way latency and the link time is bytes / bandwidth. With n robots the
  server is the shared part: aggregate = min(n · one request's speed, the server's own rate,
  1000 τ / its verify cost per round).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..engine.drafters import TreeSpec
from .device_plan import DevicePlan, candidate, tree_record

LLAMA_CPP = "llama.cpp"
DEPLOYMENTS = ("single", "edge_cloud", "pipeline")
OBJECTIVES = ("latency", "throughput")
MAX_CONCURRENCY = 1024
ANSWER_TOKENS = 64  # edge-cloud: the answer length cloud decoding's one round trip is spread over
# Wire sizes (bytes, CDR of DraftTree / VerifyResult with a short request id, greedy): fixed + per token.
DRAFT_BYTES, DRAFT_TOKEN_BYTES = 128, 12  # token id, parent, draft probability
RESULT_BYTES, RESULT_TOKEN_BYTES = 96, 12  # accepted node, accepted id, probability


@dataclass(frozen=True)
class TreeMeasure:
    """One tree shape as measured: τ per verification and ms to draft the whole tree."""

    spec: TreeSpec
    tau: float
    draft_ms: float


@dataclass(frozen=True)
class DraftMeasure:
    """One drafter as measured: where it runs, its ms per drafted token, τ of sd per γ, its trees."""

    backend: str
    description: str
    ms_per_token: float
    tau: dict[int, float]
    trees: Sequence[TreeMeasure] = ()

    def record(self) -> dict:
        """As the plan file keeps it."""
        return {"backend": self.backend, "description": self.description, "ms_per_token": self.ms_per_token,
                "tau": {str(g): t for g, t in self.tau.items()},
                "trees": [{"tree": tree_record(m.spec), "tau": m.tau, "draft_ms": m.draft_ms} for m in self.trees]}

    @classmethod
    def from_record(cls, d: dict) -> DraftMeasure:
        trees = [TreeMeasure(TreeSpec(**t["tree"]), float(t["tau"]), float(t["draft_ms"])) for t in d.get("trees", ())]
        return cls(d["backend"], d.get("description", ""), float(d["ms_per_token"]),
                   {int(g): float(t) for g, t in d["tau"].items()}, trees)


@dataclass(frozen=True)
class Measurements:
    """A device's measurements: ``costs[backend][n]`` ms for n rows, ``tree_costs[backend][W]``, drafts."""

    costs: dict[str, dict[int, float]]
    drafts: Sequence[DraftMeasure] = ()
    tree_costs: dict[str, dict[int, float]] = field(default_factory=dict)

    @classmethod
    def from_record(cls, record: dict) -> Measurements:
        """From a plan record; ValueError if it keeps none (or not in this schema)."""
        try:
            costs = {b: {int(n): float(c) for n, c in cost.items()} for b, cost in record["row_costs_ms"].items()}
            trees = {b: {int(w): float(c) for w, c in cost.items()}
                     for b, cost in record.get("tree_costs_ms", {}).items()}
            drafts = [DraftMeasure.from_record(d) for d in record.get("drafts", ())]
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ValueError(f"the plan keeps no usable measurements ({type(exc).__name__}: {exc}); "
                             "measure again (edge-llm-ros plan --device)") from None
        if not costs or any(1 not in cost for cost in costs.values()):
            raise ValueError("the plan keeps no row costs of one row; measure again (edge-llm-ros plan --device)")
        return cls(costs, drafts, trees)

    def without(self, backend: str) -> Measurements:
        """As if ``backend`` were not installed (its target and its drafts gone)."""
        return Measurements({b: c for b, c in self.costs.items() if b != backend},
                            [d for d in self.drafts if d.backend != backend],
                            {b: c for b, c in self.tree_costs.items() if b != backend})

    def tree_cost(self, backend: str, width: int) -> float | None:
        """ms to verify a tree of ``width`` nodes (default: cost(W + 1) chain rows where W + 1 was timed)."""
        return self.tree_costs.get(backend, {}).get(width, self.costs[backend].get(width + 1))


def load_measurements(path: str | os.PathLike) -> Measurements:
    """The measurements a plan file keeps (:mod:`.device_plan` reads its choice); ValueError if none."""
    try:
        record = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"plan {path}: cannot read it: {exc}") from exc
    if not isinstance(record, dict):
        raise ValueError(f"plan {path}: not a JSON object")
    return Measurements.from_record(record)


def cost_at(cost: dict[int, float], n: int) -> float:
    """ms for n rows off a measured curve: measured, else linear between its nearest points, beyond
    the last from the last two (a single point: proportional)."""
    if n in cost:
        return cost[n]
    points = sorted(cost)
    below, above = [p for p in points if p < n], [p for p in points if p > n]
    if below and above:
        a, b = below[-1], above[0]
    elif len(points) >= 2:
        a, b = (points[-2], points[-1]) if below else (points[0], points[1])
    else:
        return cost[points[0]] * n / points[0]
    return cost[a] + (cost[b] - cost[a]) * (n - a) / (b - a)


# -- one request, one device (what plan --device saves) -----------------------------------------------


def choose(costs: dict[str, dict[int, float]], drafts: Sequence[DraftMeasure],
           tree_costs: dict[str, dict[int, float]] | None = None) -> dict:
    """Predicted tokens/s of every (backend, mode, shape, draft) candidate, and the fastest.

    ``costs[backend][n]``: ms to evaluate n chain rows; ``tree_costs[backend][W]``: ms to verify a
    tree of W nodes (default ``costs[backend][W + 1]``).
    """
    scored = [p.candidate for p in single_candidates(Measurements(costs, drafts, tree_costs or {}))]
    return {"choice": max(scored, key=lambda c: c["tokens_per_s"]),
            "candidates": sorted(scored, key=lambda c: -c["tokens_per_s"])}


@dataclass
class Prediction:
    """One scored candidate: the file's candidate record, its line of text, and why it scores so."""

    candidate: dict
    text: str
    detail: str = ""  # what decides its speed, for the reason sentence

    @property
    def tokens_per_s(self) -> float:
        return self.candidate["tokens_per_s"]

    @property
    def speculative(self) -> bool:
        return self.candidate["mode"] != "ar"


def describe(c: dict) -> str:
    """``sd γ=2 on llama.cpp, draft on torch`` of a candidate record."""
    tree = TreeSpec(**c["tree"]) if c.get("tree") else None
    return DevicePlan(c["backend"], c["mode"], c["gamma"], tree, c["draft_backend"] or "", c["tokens_per_s"],
                      "", 1).describe()


def predict(backend: str, mode: str, tokens_per_s: float, detail: str = "", suffix: str = "", **shape) -> Prediction:
    c = candidate(backend, mode, tokens_per_s, **shape)
    return Prediction(c, describe(c) + suffix, detail)


@dataclass(frozen=True)
class Round:
    """One speculative round of a draft on a backend: draft, then verify; τ tokens come out of it."""

    mode: str  # sd | tree
    shape: dict  # {"gamma": γ} or {"tree": TreeSpec}
    tau: float
    draft_ms: float
    verify_ms: float
    nodes: int  # drafted tokens sent to verification
    verified: str  # what is verified, in words


def rounds(m: Measurements, backend: str, d: DraftMeasure) -> list[Round]:
    """Every sd γ and tree shape of draft ``d`` with the target on ``backend``, where its cost was timed."""
    cost = m.costs[backend]
    out = [Round("sd", {"gamma": gamma}, tau, gamma * d.ms_per_token, cost[gamma + 1], gamma, f"{gamma + 1} rows")
           for gamma, tau in d.tau.items() if gamma + 1 in cost]
    for tree in d.trees:
        verify = m.tree_cost(backend, tree.spec.width)
        if verify is not None:
            out.append(Round("tree", {"tree": tree.spec}, tree.tau, tree.draft_ms, verify, tree.spec.width,
                             f"a {tree.spec.width}-node tree"))
    return out


def single_candidates(m: Measurements) -> list[Prediction]:
    """Every (backend, mode, shape, draft) for one request here: ar, sd per γ, tree per shape."""
    out = []
    for backend, cost in m.costs.items():
        out.append(predict(backend, "ar", 1000 / cost[1], f"one row costs {cost[1]:.1f} ms"))
        for d in m.drafts:
            for r in rounds(m, backend, d):
                out.append(predict(backend, r.mode, 1000 * r.tau / (r.draft_ms + r.verify_ms), (
                    f"verifying {r.verified} costs {r.verify_ms / cost[1]:.1f}x one row here "
                    f"(+ {r.draft_ms:.0f} ms drafting) while τ is {r.tau:.2f}"), draft_backend=d.backend, **r.shape))
    return out


# -- deployments ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DeploymentRequest:
    """What to plan for (srv/Plan's request); ValueError with a one-line reason if it makes no sense."""

    deployment: str = "single"
    objective: str = "latency"
    concurrency: int = 1
    link_latency_ms: float = 0.0
    link_bandwidth_mbps: float = 0.0  # 0 = not limited

    def __post_init__(self) -> None:
        if self.deployment not in DEPLOYMENTS:
            raise ValueError(f"deployment must be one of {' | '.join(DEPLOYMENTS)}, got {self.deployment!r}")
        if self.objective not in OBJECTIVES:
            raise ValueError(f"objective must be one of {' | '.join(OBJECTIVES)}, got {self.objective!r}")
        if not 1 <= self.concurrency <= MAX_CONCURRENCY:
            raise ValueError(f"concurrency must be in 1..{MAX_CONCURRENCY} (0 = 1), got {self.concurrency}")
        for name in ("link_latency_ms", "link_bandwidth_mbps"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a finite number >= 0, got {value}")
        if self.deployment == "pipeline":
            raise ValueError("pipeline deployments cannot be planned yet: pipeline stages do not exist "
                             "(issue 14); plan single or edge_cloud")

    def link_ms(self, size: int) -> float:
        """ms to put ``size`` bytes on the link (0 when the bandwidth is not limited)."""
        return 8 * size / (1000 * self.link_bandwidth_mbps) if self.link_bandwidth_mbps else 0.0


@dataclass
class DeploymentPlan:
    """The answer: every candidate (fastest first), the winner, and a sentence saying why it won."""

    choice: Prediction
    candidates: list[Prediction]
    reason: str


def plan_deployment(m: Measurements, request: DeploymentRequest) -> DeploymentPlan:
    """Score every candidate of ``request`` from ``m`` and pick the fastest (the objective's number)."""
    n = request.concurrency
    if request.deployment == "edge_cloud":
        scored = edge_cloud_candidates(m, request)
    else:
        scored = [concurrent(m, p, n) for p in single_candidates(m)] if n > 1 else single_candidates(m)
    if request.objective == "latency" and n > 1:  # one request's share
        for p in scored:
            p.candidate["tokens_per_s"] /= n
    scored.sort(key=lambda p: -p.tokens_per_s)
    unit = "tok/s" if n == 1 else "tok/s in all" if request.objective == "throughput" else "tok/s per request"
    return DeploymentPlan(scored[0], scored, reason(scored, unit))


def concurrent(m: Measurements, p: Prediction, n: int) -> Prediction:
    """``p`` serving n requests at once, as aggregate tokens/s (see the module docstring)."""
    c = p.candidate
    if c["backend"] == LLAMA_CPP and c["mode"] == "ar":
        cost = m.costs[LLAMA_CPP]
        batched = cost_at(cost, n)
        return predict(LLAMA_CPP, "ar", 1000 * n / batched, (
            f"{n} requests share each pass (continuous batching): {n} rows cost {batched / cost[1]:.1f}x one row"),
            suffix=f", {n} requests batched")
    how = "one request at a time" if c["backend"] == LLAMA_CPP else "requests interleaved, unbatched"
    return Prediction(dict(c), f"{p.text}, {how}", f"{how}: {p.detail}" if p.speculative else how)


def edge_cloud_candidates(m: Measurements, request: DeploymentRequest) -> list[Prediction]:
    """The robot drafts, the server (costs as measured here) verifies, every round pays the link."""
    latency, n = request.link_latency_ms, request.concurrency
    out = []
    for backend, cost in m.costs.items():
        per_token = max(cost[1], request.link_ms(RESULT_BYTES + RESULT_TOKEN_BYTES))
        answer_ms = 2 * latency + ANSWER_TOKENS * per_token
        out.append(served(predict(backend, "ar", 1000 * ANSWER_TOKENS / answer_ms, (
            f"one round trip ({2 * latency:.0f} ms) per {ANSWER_TOKENS}-token answer, then a token every "
            f"{per_token:.1f} ms"), suffix=" (cloud decoding)"), 1000 / cost[1], n))
        for d in m.drafts:
            for r in rounds(m, backend, d):
                link = 2 * latency + request.link_ms(DRAFT_BYTES + DRAFT_TOKEN_BYTES * r.nodes) \
                    + request.link_ms(RESULT_BYTES + RESULT_TOKEN_BYTES * (r.nodes + 1))
                out.append(served(predict(backend, r.mode, 1000 * r.tau / (r.draft_ms + link + r.verify_ms), (
                    f"each round of τ={r.tau:.2f} tokens pays {link:.0f} ms of link, {r.draft_ms:.0f} ms drafting "
                    f"and {r.verify_ms:.0f} ms verifying"), suffix=" over the link", draft_backend=d.backend,
                    **r.shape), 1000 * r.tau / r.verify_ms, n))
    return out


def served(p: Prediction, server_rate: float, n: int) -> Prediction:
    """Edge-cloud with n robots: the server's own rate (tokens/s while busy) caps the aggregate."""
    if n > 1:
        p.candidate["tokens_per_s"] = min(n * p.tokens_per_s, server_rate)
    return p


def reason(scored: Sequence[Prediction], unit: str) -> str:
    """Why the winner won: its prediction, the best of the other kind (ar vs speculative) and what
    decides between them (when ar wins: what ar pays, then what the speculative rival pays)."""
    best = scored[0]
    rival = next((p for p in scored if p.speculative != best.speculative), None)
    head = f"{best.text}: {best.tokens_per_s:.0f} {unit} predicted"
    if rival is None:
        return head + ("; no draft was measured, so ar is the only mode" if not best.speculative else "")
    kind = "speculative candidate" if rival.speculative else "ar candidate"
    why = best.detail if best.speculative else f"{best.detail}; {rival.detail}"
    return f"{head}; best {kind} {rival.text} predicts {rival.tokens_per_s:.0f} {unit}: {why}"
