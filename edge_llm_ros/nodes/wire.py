"""Core records <-> wire messages: the node side of every message that carries a core record.

Core knows token ids, tensors and plain records, never messages; a node translates here, once per
message kind: HiddenStates <-> core/pipeline/stages.Rows (:class:`StageMessage`); msg/Plan <->
a pipeline plan (:func:`pipeline_plan_fields`, :func:`pipeline_plan_of`) and a device plan
(:func:`device_plan_of`); and records whose fields equal a message's (DraftRequest <-> DraftTree,
VerifyOutcome <-> VerifyResult: :func:`from_message`, :func:`to_message`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from edge_llm_ros.core.pipeline.stages import Rows, StageError


class WireError(StageError):
    """A malformed HiddenStates message; ``field`` names the field at fault."""

    def __init__(self, field_name: str, message: str) -> None:
        super().__init__(f"{field_name}: {message}")
        self.field = field_name


WIRE_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16, "int64": torch.long}


@dataclass
class StageMessage:
    """HiddenStates.msg without the header, field for field (``round`` is the rows' step)."""

    request_id: str
    round: int
    stage: int
    prefix_len: int
    first_row: int
    after_prune: int
    position_ids: list[int]
    mask: bytes
    shape: list[int]
    dtype: str
    data: bytes
    task: str = ""
    grammar_states: list[int] = dataclasses.field(default_factory=list)
    image_features: list[float] = dataclasses.field(default_factory=list)
    choice_probs: list[float] = dataclasses.field(default_factory=list)

    @classmethod
    def from_rows(cls, rows: Rows, stage: int, dtype: str | None = None,
                  probs: Sequence[float] = ()) -> StageMessage:
        """Rows for ``stage`` (hidden states sent as ``dtype``, default their own; token ids as int64);
        ``probs``: the last stage's, with its choices."""
        import numpy as np

        tensor = rows.data.detach().contiguous()
        if tensor.dtype != torch.long and dtype is not None:
            tensor = tensor.to(WIRE_DTYPES[dtype])
        name = next(k for k, v in WIRE_DTYPES.items() if v == tensor.dtype)
        mask = b"" if rows.visible is None else np.packbits(rows.visible.numpy().astype(np.uint8)).tobytes()
        return cls(rows.request_id, rows.step, stage, rows.prefix_len, rows.first_row, rows.after_prune,
                   rows.positions.tolist(), mask, list(tensor.shape), name, tensor.view(torch.uint8).numpy().tobytes(),
                   rows.task, [] if rows.states is None else rows.states.tolist(),
                   [] if rows.image is None else rows.image.flatten().tolist(), [float(p) for p in probs])

    @classmethod
    def from_msg(cls, msg) -> StageMessage:
        """From a received HiddenStates (either runtime's field types)."""
        return cls(str(msg.request_id), int(msg.round), int(msg.stage), int(msg.prefix_len), int(msg.first_row),
                   int(msg.after_prune), [int(p) for p in msg.position_ids], bytes(msg.mask), [int(s) for s in msg.shape], str(msg.dtype),
                   bytes(msg.data), str(msg.task), [int(s) for s in msg.grammar_states],
                   [float(v) for v in msg.image_features], [float(p) for p in msg.choice_probs])

    def fields(self) -> dict:
        """Keyword arguments for a HiddenStates message (byte fields as array('B'), which rclpy's
        uint8[] setter takes without a per-element check, as the embedded runtime does)."""
        from array import array

        return {**dataclasses.asdict(self), "mask": array("B", self.mask), "data": array("B", self.data)}

    def to_rows(self, width: int | None, dtype: torch.dtype = torch.float32) -> Rows:
        """The rows, hidden states of ``width`` (None: token ids) as ``dtype``; WireError naming the field
        at fault for any inconsistency."""
        import numpy as np

        t = len(self.position_ids)
        if t == 0:
            raise WireError("position_ids", "no rows")
        if self.dtype not in WIRE_DTYPES:
            raise WireError("dtype", f"expected one of {' | '.join(WIRE_DTYPES)}, got {self.dtype!r}")
        want = [t] if width is None else [t, width]
        if width is None and self.dtype != "int64":
            raise WireError("dtype", f"token ids into the first stage are int64, got {self.dtype}")
        if width is not None and self.dtype == "int64":
            raise WireError("dtype", "hidden states are float32 | float16 | bfloat16, got int64")
        if list(self.shape) != want:
            raise WireError("shape", f"expected {want} ({'rows' if width is None else f'rows, width {width}'}), "
                                     f"got {list(self.shape)}")
        element = torch.empty(0, dtype=WIRE_DTYPES[self.dtype]).element_size()
        if len(self.data) != t * (width or 1) * element:
            raise WireError("data", f"{len(self.data)} bytes for shape {want} of {self.dtype} "
                                    f"({t * (width or 1) * element} expected)")
        data = torch.frombuffer(bytearray(self.data), dtype=WIRE_DTYPES[self.dtype]).reshape(want)
        visible = None
        if self.mask:
            cols = self.first_row + t
            if len(self.mask) != (t * cols + 7) // 8:
                raise WireError("mask", f"{len(self.mask)} bytes for [{t}, first_row + rows = {cols}] bits "
                                        f"({(t * cols + 7) // 8} expected)")
            bits = np.unpackbits(np.frombuffer(self.mask, dtype=np.uint8))[: t * cols]
            visible = torch.from_numpy(bits.reshape(t, cols).astype(bool))
        states = None
        if self.grammar_states:
            if len(self.grammar_states) != t:
                raise WireError("grammar_states", f"{len(self.grammar_states)} states for {t} rows")
            if min(self.grammar_states) < -1:
                raise WireError("grammar_states", f"a state is a number >= 0 (or -1: none), got "
                                                  f"{min(self.grammar_states)}")
            states = torch.tensor(self.grammar_states, dtype=torch.long)
        image = None
        if self.image_features:
            image = torch.tensor(self.image_features, dtype=torch.float32)
            if not bool(torch.isfinite(image).all()):
                raise WireError("image_features", "must be finite")
        if self.choice_probs and len(self.choice_probs) != t:
            raise WireError("choice_probs", f"{len(self.choice_probs)} probabilities for {t} rows")
        return Rows(self.request_id, self.round, self.prefix_len, self.first_row,
                    torch.tensor(self.position_ids, dtype=torch.long),
                    data if width is None else data.to(dtype), visible, self.after_prune, self.task, states, image)


# -- msg/Plan ------------------------------------------------------------------------------------------


def pipeline_plan_fields(plan, stage_nodes: Sequence[str] = ()) -> dict:
    """msg/Plan's fields of a core/planning PipelinePlan: ``segment`` (the rows verified per message,
    Ghidorah's verification width) and ``in_flight`` as draft_node takes them; tree_width/depth/branch/
    expand describe FlowSpec's initial tree (draft_node's, which Chunk-PP verifies too)."""
    from edge_llm_ros.core.pipeline.schedulers import FlowSpecShape

    shape = FlowSpecShape()
    return dict(mode=plan.mode, backend="torch", draft_backend="" if plan.mode == "ar" else "torch",
                threads=plan.threads, stage_layer_begin=[s.layers.start for s in plan.stages],
                stage_layer_end=[s.layers.stop for s in plan.stages],
                stage_nodes=list(stage_nodes) or [f"stage_{i}" for i in range(len(plan.stages))],
                prefill_chunks=list(plan.prefill_chunks), gamma=0, tree_width=shape.init_size,
                tree_depth=shape.init_depth, tree_branch=shape.branch, tree_expand=shape.branch,
                segment=plan.segment, in_flight=plan.in_flight,
                expected_tokens_per_s=plan.tokens_per_s, reason=plan.reason)


def pipeline_plan_of(msg):
    """The PipelinePlan a Plan message holds: stages named by their nodes, chunks, mode, segment, speed
    and reason (bytes, budgets, per-stage times and the other modes are not in it)."""
    from edge_llm_ros.core.planning.pipeline_plan import ModePrediction, PipelinePlan, StagePlan

    ranges = [range(a, b) for a, b in zip(msg.stage_layer_begin, msg.stage_layer_end, strict=True)]
    stages = tuple(StagePlan(node, r, 0, 0, 0.0) for node, r in zip(msg.stage_nodes, ranges, strict=True))
    chunks = tuple(int(c) for c in msg.prefill_chunks)
    return PipelinePlan(stages, sum(chunks), chunks, 0.0, int(msg.segment), int(msg.in_flight),
                        (ModePrediction(msg.mode, float(msg.expected_tokens_per_s), msg.reason),), msg.reason,
                        int(msg.threads))


def device_plan_of(msg):
    """The core/planning DevicePlan a Plan message describes; PlanError (a ValueError) saying what is wrong."""
    from edge_llm_ros.core.engine.drafters import TreeSpec
    from edge_llm_ros.core.planning.device_plan import TREE_MODES, candidate, parse_plan, plan_record

    tree = (TreeSpec(depth=int(msg.tree_depth), branch=int(msg.tree_branch), expand=int(msg.tree_expand),
                     width=int(msg.tree_width)) if msg.mode in TREE_MODES else None)
    draft_backend = msg.draft_backend or msg.backend
    choice = candidate(msg.backend, msg.mode, float(msg.expected_tokens_per_s), int(msg.gamma), tree, draft_backend)
    return parse_plan(plan_record(choice, model="", threads=max(int(msg.threads), 1), draft_backend=draft_backend))


# -- records whose fields equal a message's -------------------------------------------------------------


def from_message(record_cls, msg):
    """The core dataclass ``record_cls`` from a message with the same fields (sequences as lists)."""
    return record_cls(**{f.name: _plain(getattr(msg, f.name)) for f in dataclasses.fields(record_cls)})


def to_message(msg_cls, record):
    """The message ``msg_cls`` from a core dataclass record with the same fields."""
    return msg_cls(**{f.name: getattr(record, f.name) for f in dataclasses.fields(record)})


def _plain(value):
    return value.tolist() if hasattr(value, "tolist") else list(value) if isinstance(value, (list, tuple)) else value
