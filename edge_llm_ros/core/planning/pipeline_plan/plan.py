"""A pipeline plan as data: the stages, the prefill chunks, FlowSpec's shape and every mode's
predicted speed, as a ROS 2 params file and as msg/Plan's fields.

Contract: :class:`PipelinePlan` (made by :func:`~.predict.plan_pipeline`) writes a params file for
launch/stages.launch.py layered over config/stages.yaml (:meth:`~PipelinePlan.to_yaml`: every
node's ``layers``, draft_node's ``mode``, ``segment`` and ``prefill_chunk``, the plan itself
under the PLAN_ENTRY entry that no node reads, the table as comments) and reads it back
(:meth:`~PipelinePlan.from_yaml`); nodes/wire.py maps it onto msg/Plan. Knows nothing about ROS (a params file
is YAML text here).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

import yaml

from ...pipeline.schedulers import FlowSpecShape
from ..partition import size_text

SEGMENTS = (1, 2, 4, 8, 16, 32, 64)  # Ghidorah §III-C2: widths at powers of two suit vector units
PLAN_ENTRY = "pipeline_plan"  # the params-file entry holding the plan as data; no node of this name runs


@dataclass(frozen=True)
class PlanRequest:
    """What to plan for: the prompt length (prefill chunks), the answer length (the KV context the
    memory must hold: prompt + answer + the draft tree's rows), Jupiter's least chunk b, the wire
    size of a hidden state's element, the segments tried and FlowSpec's tree shape."""

    prompt_len: int = 128
    new_tokens: int = 64
    min_chunk: int = 8
    wire_bytes: int = 4  # float32 hidden states (stages.yaml wire_dtype)
    segments: tuple[int, ...] = SEGMENTS
    shape: FlowSpecShape = FlowSpecShape()

    def __post_init__(self):
        for name, least in (("prompt_len", 1), ("new_tokens", 0), ("min_chunk", 1)):
            if getattr(self, name) < least:
                raise ValueError(f"{name} must be >= {least}, got {getattr(self, name)}")
        if not self.segments or min(self.segments) < 1:
            raise ValueError(f"segments must be row counts >= 1, got {self.segments}")

    @property
    def context(self) -> int:
        return self.prompt_len + self.new_tokens + self.shape.init_size

    @property
    def cached(self) -> int:
        """The cached rows decoding costs are taken at: half-way through the answer."""
        return self.prompt_len + self.new_tokens // 2


@dataclass(frozen=True)
class StagePlan:
    """Stage i: its device, its decoder layers, what it holds against the device's budget, its time."""

    device: str
    layers: range
    bytes: int  # weights + KV cache at the planned context
    budget: int
    seconds: float  # one segment of the plan's rows here, its hop included

    @property
    def text(self) -> str:
        return f"{self.layers.start}-{self.layers.stop - 1}"


@dataclass(frozen=True)
class ModePrediction:
    """One pipeline mode's predicted tokens/s and what decides it."""

    mode: str
    tokens_per_s: float
    why: str

    def __post_init__(self):
        object.__setattr__(self, "tokens_per_s", float(self.tokens_per_s))


@dataclass(frozen=True)
class PipelinePlan:
    """The deployment: stage i runs ``stages[i].layers`` on its device; prompts of ``prompt_len``
    tokens enter as ``prefill_chunks``; D0 decodes in ``mode`` with FlowSpec segments of
    ``segment`` rows, ``in_flight`` at once; ``predictions`` fastest first, ``notes`` say where
    the numbers come from."""

    stages: tuple[StagePlan, ...]
    prompt_len: int
    prefill_chunks: tuple[int, ...]
    prefill_s: float
    segment: int
    in_flight: int
    predictions: tuple[ModePrediction, ...]
    reason: str = ""  # why the winner won (:func:`plan_reason`)
    threads: int = 0  # torch threads per stage it was measured with (0: not measured here)
    notes: tuple[str, ...] = ()

    @property
    def mode(self) -> str:
        return self.predictions[0].mode

    @property
    def tokens_per_s(self) -> float:
        return self.predictions[0].tokens_per_s

    @property
    def layers(self) -> str:
        """As launch/stages.launch.py takes them: ``0-14,15-29``."""
        return ",".join(s.text for s in self.stages)

    @property
    def prefill_chunk(self) -> int:
        """draft_node's one chunk size: as many equal chunks as Eq. 4 chose (its sizes differ)."""
        return math.ceil(self.prompt_len / len(self.prefill_chunks))

    @property
    def bottleneck(self) -> StagePlan:
        return max(self.stages, key=lambda s: s.seconds)

    # -- as a params file for launch/stages.launch.py ------------------------------------------------

    def parameters(self) -> tuple[dict, dict]:
        """(every stage's and draft_node's parameters, draft_node's own) as stages.yaml names them."""
        shared = {"layers": self.layers, **({"threads": self.threads} if self.threads else {})}
        return shared, {"mode": self.mode, "segment": self.segment, "in_flight": self.in_flight,
                        "prefill_chunk": self.prefill_chunk}

    def launch_arguments(self) -> list[str]:
        shared, draft = self.parameters()
        return [f"{k}:={v}" for k, v in {**shared, **draft}.items()]

    def summary(self) -> list[str]:
        """The plan as a table, for people (the params file's comments, ``plan --pipeline``)."""
        lines = [f"{'stage':<6}{'device':<14}{'layers':<9}{'memory (budget)':<22}{'ms a segment':>12}"]
        for i, s in enumerate(self.stages):
            lines.append(f"{i:<6}{s.device:<14}{s.text:<9}{f'{size_text(s.bytes)} ({size_text(s.budget)})':<22}"
                         f"{s.seconds * 1e3:>12.2f}")
        chunks = "+".join(map(str, self.prefill_chunks))
        lines += ["", f"prefill of {self.prompt_len} tokens: chunks {chunks} (Jupiter Eq. 2-4), "
                      f"{self.prefill_s * 1e3:.0f} ms predicted; draft_node takes prefill_chunk {self.prefill_chunk}",
                  f"flowspec shape: segment {self.segment}, {self.in_flight} in flight", "",
                  f"{'mode':<10}{'pred tok/s':>11}  why"]
        lines += [f"{p.mode:<10}{p.tokens_per_s:>11.1f}  {p.why}" for p in self.predictions]
        return lines + [""] + [f"note: {n}" for n in self.notes]

    def candidates(self) -> list[str]:
        """Each mode's prediction in a few words, fastest first (srv/Plan's candidates)."""
        shapes = {"flowspec": f", segment {self.segment}, {self.in_flight} in flight",
                  "chunk_pp": f", a {FlowSpecShape().init_size}-node tree a round in chunks of {self.segment}",
                  "ar": ""}
        return [f"{p.mode}{shapes.get(p.mode, '')} on {len(self.stages)} stages" for p in self.predictions]

    def record(self) -> dict:
        """The plan as parameters of the PLAN_ENTRY entry (ROS parameter types only)."""
        return {"layers": self.layers, "segment": self.segment,
                "devices": [s.device for s in self.stages], "stage_bytes": [s.bytes for s in self.stages],
                "budget_bytes": [s.budget for s in self.stages], "stage_s": [s.seconds for s in self.stages],
                "prompt_len": self.prompt_len, "prefill_chunks": list(self.prefill_chunks),
                "prefill_s": self.prefill_s, "in_flight": self.in_flight,
                "modes": [p.mode for p in self.predictions], "tokens_per_s": [p.tokens_per_s for p in self.predictions],
                "why": [p.why for p in self.predictions], "reason": self.reason, "threads": self.threads,
                "notes": list(self.notes) or ["-"]}

    def to_yaml(self) -> str:
        """A ROS 2 params file for launch/stages.launch.py: ``layers`` for every node, draft_node's
        ``mode``, ``segment`` and ``prefill_chunk``, layered over config/stages.yaml (a later params
        file overrides an earlier one); the plan itself under PLAN_ENTRY; the table as comments."""
        shared, draft = self.parameters()
        lines = ["# A stage pipeline plan for launch/stages.launch.py (edge-llm-ros plan --pipeline): it overrides",
                 "# config/stages.yaml. Every number is a prediction (core/planning/pipeline_plan), not a measurement.",
                 f"#   launch arguments: {' '.join(self.launch_arguments())}", "#"]
        lines += [f"# {line}".rstrip() for line in self.summary()]
        lines += ["/**:", "  ros__parameters:", *(f"    {k}: {flow(v)}" for k, v in shared.items()),
                  "edge_llm:", "  draft_node:", "    ros__parameters:",
                  *(f"      {k}: {flow(v)}" for k, v in draft.items()),
                  f"  {PLAN_ENTRY}:  # this plan as data (PipelinePlan.from_yaml); no node of this name runs",
                  "    ros__parameters:", *(f"      {k}: {flow(v)}" for k, v in self.record().items())]
        return "\n".join(lines) + "\n"

    @classmethod
    def from_yaml(cls, text: str) -> PipelinePlan:
        """A plan :meth:`to_yaml` wrote; ValueError if it is not one, or its layers, mode, segment or
        prefill chunk were edited since (its predictions no longer hold: plan again)."""
        try:
            doc = yaml.safe_load(text)
            shared, draft = doc["/**"]["ros__parameters"], doc["edge_llm"]["draft_node"]["ros__parameters"]
            r = doc["edge_llm"][PLAN_ENTRY]["ros__parameters"]
            ranges = [range(int(a), int(b) + 1) for a, b in (part.split("-") for part in r["layers"].split(","))]
            stages = tuple(StagePlan(*args) for args in zip(r["devices"], ranges, r["stage_bytes"], r["budget_bytes"],
                                                            r["stage_s"], strict=True))
            plan = cls(stages, r["prompt_len"], tuple(r["prefill_chunks"]), r["prefill_s"], r["segment"],
                       r["in_flight"], tuple(ModePrediction(*p) for p in zip(r["modes"], r["tokens_per_s"], r["why"],
                                                                              strict=True)),
                       r["reason"], r["threads"], tuple(n for n in r["notes"] if n != "-"))
        except (yaml.YAMLError, KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ValueError(f"not a pipeline plan ({type(exc).__name__}: {' '.join(str(exc).split())})") from None
        planned = {**plan.parameters()[0], **plan.parameters()[1]}
        edited = {k: v for k, v in {**shared, **draft}.items() if k in planned and v != planned[k]}
        if edited:
            raise ValueError(f"the plan's {', '.join(f'{k}:={v}' for k, v in edited.items())} were edited since "
                             f"it was made ({', '.join(f'{k}:={planned[k]}' for k in edited)}): its predictions no "
                             "longer hold; plan again")
        return plan


def flow(value) -> str:
    """A YAML flow value that reads back as ``value`` (floats exactly; strings quoted)."""
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    text = yaml.safe_dump(value, default_flow_style=True, width=float("inf"), allow_unicode=True).strip()
    return text[:-3].rstrip() if text.endswith("\n...") else text
