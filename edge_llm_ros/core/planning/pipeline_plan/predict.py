"""Planning a stage pipeline: the split, FlowSpec's shape and what each mode is predicted to reach.

Contract: :func:`plan_pipeline` takes Devices, a ModelShape and a PlanRequest and returns a
PipelinePlan in milliseconds (32 layers x 8 devices well under a second), checking every
device's memory budget first (PartitionError naming the device, before any cost is asked for,
so before anything is measured or loaded). Every number it returns is a prediction. Knows
nothing about ROS.

A stage's time for one message of T rows over C cached rows is its layers' times on its device,
then the hop: T rows of hidden states to the next device, or for the last stage the final norm +
LM head and T greedy tokens back to D0 (the draft node, on the first device). With P(T) the
slowest stage and L(T) the sum over stages (one message's loop back to D0), d a draft forward (a
tree level) on D0 and τ(W) the tokens a verification of a W-node draft tree yields:

* ``ar`` (the naive pipeline): 1 / L(1), one row in flight;
* ``chunk_pp`` (FlowSpec's baseline): τ(W) / (L(S) + (k - 1) · P(S) + depth · d), FlowSpec's
  initial tree of W nodes and its root sent as k = ⌈(W + 1) / S⌉ chunks of the segment's S rows
  back to back (FlowSpec §V-A: one setting for every method), verified once all are back;
* ``flowspec`` (§III): F segments of S rows in flight, D0 expanding the tree on every answer:
  a turn every max(P(S), e · d, (L(S) + e · d) / F) (e: the expansion's depth) commits
  τ(F · S) / F tokens, a tree of F · S nodes being verified every F turns.

The layers are split by Jupiter's Eq. 1 (core/planning/partition.plan_layers) at FlowSpec's segment rows,
the segment chosen per hardware as in Ghidorah's ARCA (§III-C: the verification width that
maximises predicted tokens/s given what more rows cost there and what they add to τ; up to the
expansion's size, the nodes D0 adds an answer), the prompt chunked by Eq. 2-4 (plan_sequence)
with each chunk's cost that of the slowest stage.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..partition import StageDevice, plan_layers, plan_sequence
from .devices import GHIDORAH, AcceptanceCurve, Devices, DeviceSpec, ModelShape
from .plan import ModePrediction, PipelinePlan, PlanRequest, StagePlan

ANSWER_BYTES = 8  # the last stage sends back the greedy token of each row (int64)


# -- costing a split --------------------------------------------------------------------------------


def stage_seconds(device: DeviceSpec, model: ModelShape, layers: int, rows, cached, last: bool,
                  wire_bytes: int) -> np.ndarray:
    """One message of ``rows`` rows on a stage of ``layers`` decoder layers, then its hop: the hidden
    states to the next device, or (last) the final norm + head and the greedy tokens back to D0."""
    rows, cached = np.asarray(rows), np.asarray(cached)
    seconds = layers * device.layer(rows, cached)
    if last:
        return seconds + device.head_s(model, rows) + device.link.seconds(ANSWER_BYTES * rows)
    return seconds + device.link.seconds(rows * model.hidden_size * wire_bytes)


def stage_times(devices: Sequence[DeviceSpec], model: ModelShape, ranges: Sequence[range], rows: int, cached: int,
                wire_bytes: int) -> np.ndarray:
    """[stages] seconds of one ``rows``-row message at each stage."""
    last = len(ranges) - 1
    return np.array([float(stage_seconds(d, model, len(r), np.array([rows]), np.array([cached]), n == last,
                                         wire_bytes)[0]) for n, (d, r) in enumerate(zip(devices, ranges))])


def stage_devices(devices: Sequence[DeviceSpec], model: ModelShape, rows: int, cached: int,
                  wire_bytes: int) -> list[StageDevice]:
    """Eq. 1's inputs at ``rows`` rows: every layer's seconds per device, its hop, its head."""
    out = []
    for d in devices:
        at = np.array([rows]), np.array([cached])
        hop = float(d.link.seconds(rows * model.hidden_size * wire_bytes))
        head = float(d.head_s(model, at[0])[0] + d.link.seconds(ANSWER_BYTES * rows))
        out.append(StageDevice(d.name, [float(d.layer(*at)[0])] * model.num_layers, d.memory_bytes, hop, 0.0, head))
    return out


def bottleneck_cost(devices: Sequence[DeviceSpec], model: ModelShape, ranges: Sequence[range], wire_bytes: int):
    """Eq. 2-4's q(x, p): a chunk of x rows after p cached ones at the slowest stage (elementwise)."""
    last = len(ranges) - 1

    def q(rows, prefix):
        return np.max([stage_seconds(d, model, len(r), rows, prefix, n == last, wire_bytes)
                       for n, (d, r) in enumerate(zip(devices, ranges))], axis=0)

    return q


def draft_seconds(devices: Devices, model: ModelShape, request: PlanRequest) -> float:
    """One draft forward (a tree level of ``branch`` rows) on D0: given, else the shipped draft's
    layers and its vocabulary subset's share of the head on the first device."""
    if devices.draft_s is not None:
        return devices.draft_s
    d0, rows = devices.devices[0], np.array([request.shape.branch])
    layers = model.draft_layers * d0.layer(rows, np.array([request.cached]))
    return float(layers[0] + d0.head_s(model, rows)[0] * model.draft_vocab / model.vocab_size)


# -- what each mode is predicted to reach --------------------------------------------------------------


def ar_prediction(loop_s: float, stages: int) -> ModePrediction:
    """The naive pipeline: one row goes round, every stage but one idle: 1 / L(1)."""
    return ModePrediction("ar", 1 / loop_s, f"one row through {stages} stages and back, {loop_s * 1e3:.1f} ms a "
                                            "token, every stage but one idle")


def chunk_pp_prediction(times: np.ndarray, chunks: int, draft_s: float, tau: float, width: int,
                        segment: int) -> ModePrediction:
    """FlowSpec's baseline: draft a W-node tree (depth levels), send it with its root as k chunks of
    S rows back to back, verify once all are back: τ(W) / (L(S) + (k - 1) · P(S) + drafting)."""
    round_s = float(times.sum() + (chunks - 1) * times.max())
    return ModePrediction("chunk_pp", tau / (round_s + draft_s),
                          f"a {width}-node tree in {chunks} chunks of {segment} rows: {round_s * 1e3:.1f} ms through "
                          f"the stages + {draft_s * 1e3:.1f} ms drafting per round of τ={tau:.2f}")


def flowspec_prediction(times: np.ndarray, names: Sequence[str], expand_s: float, tau: float, segment: int,
                        in_flight: int, one_row_s: float) -> ModePrediction:
    """FlowSpec (§III), F segments of S rows in flight, D0 expanding the tree after each answer:

        turn = max(P(S), e·d, (L(S) + e·d) / F)   the slowest stage, D0, or the loop shared by F segments
        tok/s = τ(F·S) / (F · turn)               a tree of F·S nodes verified every F turns
    """
    slowest = int(np.argmax(times))
    limits = {f"the slowest stage ({names[slowest]}) takes {times[slowest] * 1e3:.1f} ms": times[slowest],
              f"D0 drafts {expand_s * 1e3:.1f} ms a turn": expand_s,
              f"a segment's loop ({(times.sum() + expand_s) * 1e3:.1f} ms) is shared by {in_flight}":
                  (times.sum() + expand_s) / in_flight}
    limit, turn = max(limits.items(), key=lambda kv: kv[1])
    return ModePrediction("flowspec", tau / (in_flight * turn),
                          f"{segment}-row segments ({times[slowest] / one_row_s:.1f}x one row's time at the slowest "
                          f"stage), {in_flight} in flight: a turn every {turn * 1e3:.1f} ms ({limit}), "
                          f"τ={tau:.2f} per {segment * in_flight} nodes")


# -- the plan, step by step ------------------------------------------------------------------------


def check_budgets(devices: Sequence[DeviceSpec], model: ModelShape, context: int) -> None:
    """Jupiter's T = +inf for a stage over its device's budget, asked before any cost is (nothing
    measured, nothing loaded): PartitionError naming the device when no split at whole layers fits."""
    plan_layers([StageDevice(d.name, [1.0] * model.num_layers, d.memory_bytes) for d in devices], model.cost(context))


def best_flowspec(devices: Devices, model: ModelShape, request: PlanRequest, tau: AcceptanceCurve, level_s: float):
    """Ghidorah's ARCA over the segment S (verification width) and FlowSpec's F in flight: for each S
    the Eq. 1 split at S rows, the F of most tokens/s; the best (prediction, LayerPlan, S, F, stage
    times), the smallest S and F on a tie. S stops at the expansion's size: after the initial tree
    D0 adds that many nodes an answer, so a longer segment would go out part-empty."""
    specs, names, best = devices.devices, [d.name for d in devices.devices], None
    memory, cached, wire = model.cost(request.context), request.cached, request.wire_bytes
    for segment in [s for s in request.segments if s <= request.shape.expand_size] or [request.shape.expand_size]:
        split = plan_layers(stage_devices(specs, model, segment, cached, wire), memory)
        times = stage_times(specs, model, split.ranges, segment, cached, wire)
        one_row = stage_times(specs, model, split.ranges, 1, cached, wire).max()
        for in_flight in range(1, 2 * len(specs) + 1):
            p = flowspec_prediction(times, names, request.shape.expand_depth * level_s, tau(segment * in_flight),
                                    segment, in_flight, one_row)
            if best is None or p.tokens_per_s > best[0].tokens_per_s:
                best = p, split, segment, in_flight, times
    return best


def plan_reason(predictions: Sequence[ModePrediction], stages: Sequence[StagePlan], segment: int) -> str:
    """Why the winner won: its speed against the others', what paces it, and the split."""
    best, others = predictions[0], predictions[1:]
    slowest = max(stages, key=lambda s: s.seconds)
    return (f"{best.mode}: {best.tokens_per_s:.1f} tok/s predicted "
            f"({', '.join(f'{p.mode} {p.tokens_per_s:.1f}' for p in others)}): {best.why}; layers "
            f"{','.join(s.text for s in stages)} (Jupiter Eq. 1) on {', '.join(s.device for s in stages)}, slowest "
            f"stage {slowest.device} {slowest.seconds * 1e3:.1f} ms a {segment}-row segment")


def plan_notes(devices: Devices, model: ModelShape, request: PlanRequest, tau: AcceptanceCurve,
               level_s: float) -> tuple[str, ...]:
    """Where the plan's numbers come from, in words."""
    sources: dict[str, list[str]] = {}
    for d in devices.devices:
        sources.setdefault(d.source or "given", []).append(d.name)
    draft = "given" if devices.draft_s is not None else \
        f"estimated: the draft's {model.draft_layers} layers + its head share on {devices.devices[0].name}"
    return (f"devices: {devices.source or 'given'}",
            *(f"costs of {', '.join(names)}: {source}" for source, names in sources.items()),
            f"τ: {tau.source}", f"D0: {level_s * 1e3:.2f} ms a draft tree level ({draft})",
            f"memory: weights + KV cache of {request.context} rows (prompt {request.prompt_len} + answer "
            f"{request.new_tokens} + tree {request.shape.init_size}); decoding costs at {request.cached} cached rows")


def plan_pipeline(devices: Devices, model: ModelShape, request: PlanRequest = PlanRequest(),
                  acceptance: AcceptanceCurve = GHIDORAH) -> PipelinePlan:
    """The fastest plan for ``devices`` (in their order) running ``model``: the budgets checked, then
    FlowSpec's best segment, in-flight count and Eq. 1 split (:func:`best_flowspec`), ``ar`` and
    ``chunk_pp`` predicted on that split, the prompt chunked by Eq. 2-4 at the slowest stage's cost.
    τ: the devices file's, else ``acceptance``. PartitionError naming the device when a device's
    budget cannot hold its share, whatever the split."""
    specs, shape, tau = devices.devices, request.shape, devices.acceptance or acceptance
    check_budgets(specs, model, request.context)
    level_s = draft_seconds(devices, model, request)
    flowspec, split, segment, in_flight, times = best_flowspec(devices, model, request, tau, level_s)

    def loop(rows: int) -> float:  # L(rows): one message through every stage and back to D0
        return float(stage_times(specs, model, split.ranges, rows, request.cached, request.wire_bytes).sum())

    chunk_times = stage_times(specs, model, split.ranges, segment, request.cached, request.wire_bytes)
    predictions = (flowspec, ar_prediction(loop(1), len(specs)),
                   chunk_pp_prediction(chunk_times, -(-(shape.init_size + 1) // segment), shape.init_depth * level_s,
                                       tau(shape.init_size), shape.init_size, segment))
    prefill = plan_sequence(request.prompt_len, bottleneck_cost(specs, model, split.ranges, request.wire_bytes),
                            len(specs), request.min_chunk)
    stages = tuple(StagePlan(d.name, r, b, d.memory_bytes, float(t))
                   for d, r, b, t in zip(specs, split.ranges, split.stage_bytes, times))
    predictions = tuple(sorted(predictions, key=lambda p: -p.tokens_per_s))
    threads = {d.threads for d in specs}
    return PipelinePlan(stages, request.prompt_len, prefill.chunks, prefill.latency_s, segment, in_flight, predictions,
                        plan_reason(predictions, stages, segment), threads.pop() if len(threads) == 1 else 0,
                        plan_notes(devices, model, request, tau, level_s))
