"""What a step of the stage pipeline costs: one hop of a link, a stage's message, D0's drafts;
measured on this machine (:class:`LayerProfile`, :class:`DraftCost`) or taken from the papers'
tables (:func:`jetson_costs`). The planner (core/planning/partition, pipeline_plan) and the
simulator (core/sim/pipeline.py) both read them. Knows nothing about ROS.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..engine.drafters import Drafter, TreeSpec, WrappedDrafter
from ..engine.sampling import Sampler
from ..engine.tree import TokenTree


@dataclass(frozen=True)
class Link:
    """One hop: ``latency_s`` plus ``bytes / bandwidth_bps * 8``. A sender's messages leave in order,
    each after the ones before it (runtime/link.py's token bucket without a burst)."""

    latency_s: float = 0.0
    bandwidth_bps: float = float("inf")

    def serialization_s(self, nbytes: int) -> float:
        return nbytes * 8 / self.bandwidth_bps

    def seconds(self, nbytes: int) -> float:
        return self.latency_s + self.serialization_s(nbytes)

    def describe(self) -> str:
        rate = "unlimited" if self.bandwidth_bps == float("inf") else f"{self.bandwidth_bps / 1e6:g} Mbit/s"
        return f"{rate}, {self.latency_s * 1e3:g} ms"


@dataclass
class CostModel:
    """What a step costs. ``stage_s(stage, rows, cached)``: one message on one stage;
    ``draft_s``: one draft forward (a tree level, or one token of a chain) on D0, and
    ``draft_call_s`` once per draft (the drafter's own bookkeeping); ``row_bytes``: one row of hidden
    states on a link (token ids: 8 bytes a row); ``link``: every hop (D0 -> stage 0 -> ... -> last
    stage -> D0, and D0 -> every stage for prunes: one message on D0's link); ``message_s``: what the
    runtime adds to every message besides the link (serialization, transport, wake-ups);
    ``d0_shares``: the stage whose core D0 runs on (None: a device of its own), one then waiting
    for the other; ``contention``: how many times longer a stage's message takes while another
    stage computes too (1.0: cores that do not share anything)."""

    stage_s: Callable[[int, int, int], float]
    draft_s: float = 0.0
    row_bytes: int = 0
    link: Link = Link()
    prune_bytes: int = 64
    draft_call_s: float = 0.0
    message_s: float = 0.0
    d0_shares: int | None = None
    contention: float = 1.0


# -- D0's drafts ---------------------------------------------------------------------------------------


class CountingDrafter(WrappedDrafter):
    """A drafter wrapper that counts drafts and draft forwards (tree levels) since the last :meth:`take`.
    A ModelDrafter runs ``spec.depth`` forwards (one per level) unless ``stop_below`` ends it early."""

    def __init__(self, drafter: Drafter) -> None:
        super().__init__(drafter)
        self.calls, self.forwards = 0, 0

    def propose(self, context: list[int], spec: TreeSpec, sampler: Sampler) -> TokenTree:
        tree = self.drafter.propose(context, spec, sampler)
        self.calls += 1
        self.forwards += max(tree.depth, 1) if spec.stop_below else max(spec.depth, 1)
        return tree

    def take(self) -> tuple[int, int]:
        """(drafts, forwards) since the last take."""
        taken, self.calls, self.forwards = (self.calls, self.forwards), 0, 0
        return taken


# -- costs measured on this machine -------------------------------------------------------------------


@dataclass
class LayerProfile:
    """Measured seconds of one decoder layer for ``rows`` new rows over ``cached`` rows (a grid; the
    layers of a model share one shape), and of the final norm + head per row count. What the
    planner (core/planning/partition: t_l and q(x, p)) and the simulator's :class:`CostModel` read."""

    rows: list[int]
    cached: list[int]
    layer_s: list[list[float]]  # [rows][cached]
    head_s: list[float]  # [rows]
    threads: int = 1
    source: str = ""

    def q(self):
        """q(rows, cached) of one layer, interpolated (core/planning/partition.interpolated_cost)."""
        from .partition import interpolated_cost

        return interpolated_cost(self.rows, self.cached, self.layer_s)

    def head(self, rows: int) -> float:
        import numpy as np

        return float(np.interp(rows, self.rows, self.head_s))

    def stage_s(self, ranges: Sequence[range], overhead_s: float = 0.0) -> Callable[[int, int, int], float]:
        """CostModel.stage_s for stages over ``ranges`` (the last one also runs the head)."""
        import numpy as np

        q = self.q()

        def seconds(stage: int, rows: int, cached: int) -> float:
            layer = float(q(np.asarray([rows]), np.asarray([cached]))[0])
            return overhead_s + len(ranges[stage]) * layer + (self.head(rows) if stage == len(ranges) - 1 else 0.0)

        return seconds

    def averaged(self, other: LayerProfile) -> LayerProfile:
        """The mean of two measurements on the same grid (e.g. before and after a long run)."""
        import dataclasses

        return dataclasses.replace(
            self, layer_s=[[(a + b) / 2 for a, b in zip(mine, theirs)]
                           for mine, theirs in zip(self.layer_s, other.layer_s)],
            head_s=[(a + b) / 2 for a, b in zip(self.head_s, other.head_s)],
            source=f"{self.source}, the mean of two measurements")

    @classmethod
    def measure(cls, model, rows: Sequence[int] = (1, 4, 8, 16, 32, 64), cached: Sequence[int] = (0, 256, 1024),
                repeats: int = 3, layer: int = 0) -> LayerProfile:
        """Time ``model``'s decoder layer ``layer`` (a TorchCausalLM) and its head, with the threads torch
        has now; the median of ``repeats`` after a warm-up."""
        import torch

        from ..engine.models import causal_mask
        from ..engine.timing import median_ms

        def timed(fn) -> float:
            return median_ms(lambda _: fn(), repeats) / 1000

        grid, heads = [], []
        hidden_size = model.config.hidden_size
        with torch.inference_mode():
            for n in rows:
                x = torch.randn(1, n, hidden_size, dtype=model.dtype)
                line = []
                for c in cached:
                    cache = model.new_cache(c + n, range(layer, layer + 1))
                    cache.length = c
                    positions = torch.arange(c, c + n)
                    mask = causal_mask(c, n, model.dtype) if n > 1 else None

                    def run(cache=cache, x=x, positions=positions, mask=mask, c=c):
                        cache.length = c
                        model.run_layers(x, positions, mask, cache, range(layer, layer + 1))

                    line.append(timed(run))
                grid.append(line)
                heads.append(timed(lambda x=x: model.head(x)) if model.lm_head.weight.device.type != "meta" else 0.0)
        return cls(list(rows), list(cached), grid, heads, torch.get_num_threads(),
                   f"measured: {type(model.hf).__name__} layer {layer}, {torch.get_num_threads()} threads")


@dataclass(frozen=True)
class RowScale:
    """How many times longer a deployed process takes for ``rows`` rows than the :class:`LayerProfile`
    adds up to (its layers and head), measured at ``rows``: interpolated between them, the nearest
    beyond. The profile times one layer again and again with its weights in the cache; a process
    that runs many layers in a row streams them from memory, which weighs most at few rows."""

    rows: tuple[int, ...]
    factors: tuple[float, ...]

    @classmethod
    def of(cls, rows: Sequence[int], measured_s: Sequence[float], profiled_s: Sequence[float]) -> RowScale:
        return cls(tuple(rows), tuple(float(m / p) for m, p in zip(measured_s, profiled_s)))

    def __call__(self, rows: int) -> float:
        import numpy as np

        return float(np.interp(rows, self.rows, self.factors))

    def describe(self) -> str:
        return ", ".join(f"{f:.2f}x at {n}" for n, f in zip(self.rows, self.factors)) + " rows"


class TimedDrafter(WrappedDrafter):
    """A drafter wrapper that logs (drafts, forwards, seconds) of every draft, one entry each, for
    :meth:`DraftCost.fit`. ``clock``: what a second is; draft_node passes ``time.thread_time``, the CPU
    its one torch thread spent, so that the core D0 shares with a stage is not counted in (the
    simulator adds that wait itself). Vocabulary, tokenizer (so its EOS tokens), window and
    features are the wrapped drafter's."""

    def __init__(self, drafter: Drafter, clock: Callable[[], float] = time.perf_counter) -> None:
        super().__init__(drafter)
        self.clock = clock
        self.log: list[tuple[int, int, float]] = []

    def propose(self, context: list[int], spec: TreeSpec, sampler: Sampler) -> TokenTree:
        start = self.clock()
        tree = self.drafter.propose(context, spec, sampler)
        self.log.append((1, max(spec.depth, 1), self.clock() - start))
        return tree

    def totals(self) -> tuple[int, int, float]:
        """(drafts, forwards, seconds) over the log."""
        return (sum(e[0] for e in self.log), sum(e[1] for e in self.log), sum(e[2] for e in self.log))


@dataclass(frozen=True)
class DraftCost:
    """D0's seconds per draft and per draft forward (:class:`CostModel`'s ``draft_call_s``, ``draft_s``)."""

    per_draft_s: float
    per_forward_s: float

    @classmethod
    def fit(cls, timed: Sequence[tuple[int, int, float]]) -> DraftCost:
        """Least squares over (drafts, forwards, seconds), one entry per draft or per request's totals:
        seconds = drafts x per_draft + forwards x per_forward; when the entries cannot tell the two
        apart (one depth only), or either comes out negative, all of it per forward."""
        import numpy as np

        data = np.asarray(timed, dtype=np.float64).reshape(-1, 3)
        per_forward = float(data[:, 2].sum() / data[:, 1].sum())
        if np.linalg.matrix_rank(data[:, :2]) < 2:
            return cls(0.0, per_forward)
        per_draft, slope = np.linalg.lstsq(data[:, :2], data[:, 2], rcond=None)[0]
        return cls(float(per_draft), float(slope)) if per_draft >= 0 and slope >= 0 else cls(0.0, per_forward)


# -- costs taken from the papers' tables ---------------------------------------------------------------


@dataclass(frozen=True)
class Cited:
    """One input number and where it comes from."""

    name: str
    value: float
    unit: str
    source: str


def even_ranges(num_layers: int, num_stages: int) -> list[range]:
    """``num_layers`` layers in ``num_stages`` even stages (the first ones one longer if they do not divide)."""
    size, extra = divmod(num_layers, num_stages)
    bounds = [0]
    for stage in range(num_stages):
        bounds.append(bounds[-1] + size + (stage < extra))
    return [range(a, b) for a, b in zip(bounds, bounds[1:])]


@dataclass(frozen=True)
class PaperCosts:
    """Jetson-class costs of a larger target, derived from cited numbers (:func:`jetson_costs`).
    One decoder layer runs a message of ``rows`` rows in ``layer_s * (1 + row_factor * (rows - 1))``
    (the weights read once a message, then each row's own compute); the last stage also runs the
    LM head, ``head_layers`` layers' worth."""

    device: str
    model: str
    num_layers: int
    layer_s: float
    row_factor: float
    head_layers: float
    draft_s: float
    row_bytes: int
    link: Link
    inputs: tuple[Cited, ...]
    derivation: tuple[str, ...]

    def ranges(self, num_stages: int) -> list[range]:
        return even_ranges(self.num_layers, num_stages)

    def cost_model(self, num_stages: int, draft_s: float | None = None) -> CostModel:
        """A :class:`CostModel` for ``num_stages`` stages of this model, D0 on a device of its own."""
        counts = [len(r) for r in self.ranges(num_stages)]

        def seconds(stage: int, rows: int, cached: int) -> float:
            layers = counts[stage] + (self.head_layers if stage == num_stages - 1 else 0.0)
            return layers * self.layer_s * (1 + self.row_factor * (rows - 1))

        return CostModel(stage_s=seconds, draft_s=self.draft_s if draft_s is None else draft_s,
                         row_bytes=self.row_bytes, link=self.link)


def jetson_costs(latency_s: float = 1e-3) -> PaperCosts:
    """LLaMA2-7B (fp16) on Jetson Orin Nano stages over 1000 Mbit/s, FlowSpec's testbed (§V-A), with
    every input cited. ``latency_s``: the one-way link latency (the paper gives only the bandwidth).

    * What a row adds to a pass, from Jupiter's Table IV (Llama2-7B INT4 on 4 Xavier NX, 260-token
      prompts + 64 tokens, 1 Gbps): EdgeShard (a naive pipeline) runs prefill P and 64 decode passes
      t on one device at a time, P + 64 t = 38.6 s; SP splits the prefill 4 ways and pays Table II's
      communication on top, then decodes on one device, (P / 4)(1 + 0.92) + 64 t = 35.4 s. A prompt
      row then costs (P / 260) / t of a decode pass; fp16 weights are 4x the bytes of INT4 for the
      same arithmetic, so a row costs a quarter of that relative to an fp16 pass.
    * A pipeline turn (FlowSpec §V-B: tokens committed per turn = ALT, Table II) lasts ALT / throughput,
      the same for every method (the paper's reading of Table II). Chunk-PP's turn is a verification
      stage's step over one chunk of 16 rows (Appendix A-C); the slowest stage holds 32 / 4 layers and
      the LM head, h = (vocab x hidden) / (one layer's parameters) layers' worth (time follows bytes).
    * The draft depth (5) is chosen so that D0's step matches a stage's (§IV-A, §V-C1), so one draft
      forward lasts a turn / 5."""
    hidden, inter, vocab, layers = 4096, 11008, 32000, 32
    stages, depth, chunk = 4, 5, 16
    tps_chunk, alt_chunk, tps_flow, alt_flow = 6.08, 0.54, 8.70, 1.01
    edgeshard_s, sp_s, sp_comm, prompt, new = 38.6, 35.4, 0.92, 260, 64
    inputs = (
        Cited("devices", 5, "Jetson Orin Nano", "flowspec.txt §V-A: 5 NVIDIA Jetson Orin Nano, 8 GB each"),
        Cited("bandwidth", 1000, "Mbit/s", "flowspec.txt §V-A: local area network, maximum bandwidth 1000 Mbps"),
        Cited("verification stages", stages, "stages", "flowspec.txt Appendix A-C: the draft model on a separate "
              "device, the base LLM partitioned across the rest (4)"),
        Cited("Chunk-PP throughput", tps_chunk, "tokens/s", "flowspec.txt Table I, L2 7B, Temperature = 0, Chunk-PP, "
              "Mean"),
        Cited("FlowSpec throughput", tps_flow, "tokens/s", "flowspec.txt Table I, L2 7B, Temperature = 0, FlowSpec, "
              "Mean"),
        Cited("Chunk-PP ALT", alt_chunk, "tokens/turn", "flowspec.txt Table II, L2, Chunk-PP, ALT-7B"),
        Cited("FlowSpec ALT", alt_flow, "tokens/turn", "flowspec.txt Table II, L2, FlowSpec, ALT-7B"),
        Cited("segment rows", chunk, "rows", "flowspec.txt Appendix A-C: initial segments of 16 tokens (the same "
              "setting for all methods)"),
        Cited("initial draft tree", 80, "nodes (top-10, depth 6)", "FlowSpec's reference code, config/run_config.py, "
              "mode eval (Table I's runs): init_total_token 80, init_topk 10, init_depth 6, init_subseq_token 16; "
              "the same tree for Chunk-PP"),
        Cited("context-aware expansion", 64, "nodes (depth 6)", "FlowSpec's reference code, config/run_config.py, "
              "mode eval: expand_total_token 64, expand_depth 6; none_expand False (no score-aware expansion); "
              "flowspec.txt Appendix A-C: the 64 expanded tokens"),
        Cited("draft tree depth", depth, "levels", "flowspec.txt Appendix A-C and §V-C1: depth 5 (EAGLE-2's "
              "optimum), chosen to balance D0 with a verification stage"),
        Cited("precision", 16, "bits", "flowspec.txt §V-A footnote: 7B models in fp16"),
        Cited("LLaMA2-7B layers", layers, "layers", "Llama 2 [29] in flowspec.txt (model config: 32 layers)"),
        Cited("LLaMA2-7B hidden size", hidden, "", "Llama 2 [29] in flowspec.txt (model config)"),
        Cited("LLaMA2-7B MLP size", inter, "", "Llama 2 [29] in flowspec.txt (model config)"),
        Cited("LLaMA2-7B vocabulary", vocab, "tokens", "Llama 2 [29] in flowspec.txt (model config)"),
        Cited("EdgeShard latency", edgeshard_s, "s", "jupiter.txt Table IV, Homo. Env. A (4x Xavier NX), 1Gbps, "
              "Llama2-7B (INT4, §VI-A), EdgeShard"),
        Cited("SP latency", sp_s, "s", "jupiter.txt Table IV, Homo. Env. A, 1Gbps, Llama2-7B, SP"),
        Cited("SP communication / computation", sp_comm, "", "jupiter.txt Table II, Llama2-7B, 1Gbps, SP"),
        Cited("prompt tokens", prompt, "tokens", "jupiter.txt §VI-B: LiMA prompts of 260 tokens on average"),
        Cited("generated tokens", new, "tokens", "jupiter.txt §VI-B: maximum generation length 64"),
        Cited("Jupiter's precision", 4, "bits", "jupiter.txt §VI-A: Llama2-7B with INT4 quantization"),
        Cited("draft latency on a Jetson Nano, gamma = 4", 0.334, "s", "edge_cloud_early_exit.txt Table 5, "
              "Vicuna-68m/Vicuna-7B, Jetson, Drafting Latency (gamma T_p) (a cross-check only)"),
    )
    prefill_s = (edgeshard_s - sp_s) / (1 - (1 + sp_comm) / 4)
    decode_s = (edgeshard_s - prefill_s) / new
    row_int4 = prefill_s / prompt / decode_s
    row_factor = row_int4 * 4 / 16
    layer_params = 4 * hidden * hidden + 3 * hidden * inter
    head_layers = vocab * hidden / layer_params
    turn_s = alt_chunk / tps_chunk
    per_stage = layers / stages + head_layers
    layer_s = turn_s / (per_stage * (1 + row_factor * (chunk - 1)))
    draft_s = turn_s / depth
    derivation = (
        f"Jupiter: P + {new} t = {edgeshard_s} s (EdgeShard) and (P / 4)(1 + {sp_comm}) + {new} t = {sp_s} s (SP) -> "
        f"P = {prefill_s:.2f} s, t = {decode_s * 1e3:.0f} ms a decode pass (Xavier NX, INT4)",
        f"a row adds (P / {prompt}) / t = {prefill_s / prompt * 1e3:.1f} / {decode_s * 1e3:.0f} = {row_int4:.4f} of an "
        f"INT4 pass; fp16 reads 16 / 4 = 4x the bytes for the same arithmetic: row_factor = {row_int4:.4f} / 4 = "
        f"{row_factor:.4f}",
        f"turn = ALT / throughput = {alt_chunk} / {tps_chunk} = {turn_s * 1e3:.1f} ms (Chunk-PP; FlowSpec's own: "
        f"{alt_flow} / {tps_flow} = {alt_flow / tps_flow * 1e3:.1f} ms)",
        f"one layer = 4 h^2 + 3 h m = {layer_params / 1e6:.1f} M parameters; LM head = vocab x h = "
        f"{vocab * hidden / 1e6:.1f} M = {head_layers:.3f} layers",
        f"layer_s (one row) = turn / (({layers} / {stages} + {head_layers:.3f}) layers x (1 + {row_factor:.4f} x "
        f"{chunk - 1})) = {layer_s * 1e3:.2f} ms; a message of r rows: layer_s x (1 + {row_factor:.4f} (r - 1))",
        f"draft_s = turn / depth = {turn_s * 1e3:.1f} / {depth} = {draft_s * 1e3:.2f} ms per draft forward (D0 "
        "balanced with a stage, §IV-A); the EE paper's Jetson Nano drafts at "
        f"{0.334 / 4 * 1e3:.1f} ms per draft token (Vicuna-68m), the same order",
        f"cross-check: a decode pass over {layers} layers on Orin Nano fp16 = {layers * layer_s * 1e3:.0f} ms here, "
        f"{decode_s * 1e3:.0f} ms on Xavier NX INT4 (Jupiter)",
        f"rows on the wire: fp16 hidden states, {hidden} x 2 = {hidden * 2} bytes a row; link 1000 Mbit/s, "
        f"{latency_s * 1e3:g} ms one-way (the latency is an assumption: a LAN)",
    )
    return PaperCosts("Jetson Orin Nano (projected)", "LLaMA2-7B fp16", layers, layer_s, row_factor, head_layers,
                      draft_s, hidden * 2, Link(latency_s, 1000e6), inputs, derivation)
