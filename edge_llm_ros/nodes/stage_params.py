"""stage_node's parameters, and every combination of them it refuses.

Contract: :class:`StageParams` is the node's configuration (nodes/parameters.py maps the ROS
parameters onto it once, at start). `__post_init__` refuses what cannot run with a one-line
ValueError naming the parameter (the node exits 2 at start); :meth:`StageParams.own` checks the
layers against the model at configure.
"""

from __future__ import annotations

import dataclasses

from edge_llm_ros.core.planning.partition import check_ranges, layer_ranges, range_text
from edge_llm_ros.nodes.common import cpu_set
from edge_llm_ros.nodes.managed import ManagedParams
from edge_llm_ros.nodes.parameters import param


@dataclasses.dataclass(frozen=True)
class StageParams(ManagedParams):
    model: str = param("", "the target: a .gguf file or an HF folder ('' = SmolLM2's GGUF)")
    index: int = param(0, "this stage's place in the pipeline, from 0", low=0, high=1023)
    count: int = param(0, "stages in the pipeline (0 = as many as layers gives ranges)", low=0, high=1024)
    layers: str = param("", "decoder layers, inclusive: this stage's a-b, or every stage's a-b,c-d,... "
                            "(this one's is the index-th); '' = every layer (a single stage)")
    threads: int = param(0, "torch intra-op threads (0 = every core it may run on)", low=0, high=1024)
    cpus: str = param("", "cores this stage's process is pinned to at configure, as taskset -c lists them "
                          "('1', '0-1'); '' = any core")
    wire_dtype: str = param("float32", "hidden states are sent as", choices=("float32", "float16", "bfloat16"))
    output: str = param("argmax", "what the last stage sends: the target's greedy token per row (int64) or "
                                  "its logits (float32 [rows, vocab])", choices=("argmax", "logits"))
    capacity: int = param(256, "KV cache rows first allocated per request (it grows)", low=1, high=1_000_000)
    max_requests: int = param(8, "request caches held at once; rows of a new request beyond are refused "
                                 "as busy", low=1, high=1024)
    nav_adapter: str = param("", "serve the navigator's task 'nav' too: 'shipped' (SmolLM2's adapter) or an "
                                 "adapter folder ('' = none): its LoRA merged into this stage's layers, the "
                                 "first stage conditioned on each request's image, the last constrained to "
                                 "the action grammar")

    def __post_init__(self) -> None:
        try:
            cpu_set(self.cpus)
        except ValueError:
            raise ValueError(f"parameter 'cpus' takes cores as taskset -c lists them (1, 0-1, 0,2), got "
                             f"{self.cpus!r}") from None
        ranges = layer_ranges(self.layers)
        if len(ranges) > 1:
            if self.count not in (0, len(ranges)):
                raise ValueError(f"parameter 'count' is {self.count}, but layers gives {len(ranges)} stages "
                                 f"({self.layers})")
            if self.index >= len(ranges):
                raise ValueError(f"parameter 'index' is {self.index}, but layers gives {len(ranges)} stages "
                                 f"({self.layers})")
            try:
                check_ranges(ranges, ranges[-1].stop)  # gaps and overlaps (the model's end: at configure)
            except ValueError as exc:
                raise ValueError(f"parameter 'layers' ({self.layers}): {exc}") from None
        elif self.index >= self.stages():
            raise ValueError(f"parameter 'index' is {self.index}, but the pipeline has {self.stages()} stage(s) "
                             "(parameter 'count')")
        elif self.stages() > 1 and not ranges:
            raise ValueError("parameter 'layers' must give this stage's range when the pipeline has "
                             f"{self.stages()} stages")
        elif self.index == 0 and ranges and ranges[0].start != 0:
            raise ValueError(f"stage 0 (the first) must start at layer 0, parameter 'layers' is {self.layers}")

    def stages(self) -> int:
        ranges = layer_ranges(self.layers)
        return len(ranges) if len(ranges) > 1 else self.count or 1

    def own(self, num_layers: int) -> range:
        """This stage's layers in a model of ``num_layers``; ValueError saying why they do not fit."""
        ranges = layer_ranges(self.layers) or [range(num_layers)]
        if len(ranges) > 1:
            try:
                check_ranges(ranges, num_layers)
            except ValueError as exc:
                raise ValueError(f"parameter 'layers' ({self.layers}) does not fit the model's {num_layers} "
                                 f"layers: {exc}") from None
            return ranges[self.index]
        layers, last = ranges[0], self.stages() - 1
        if layers.stop > num_layers:
            raise ValueError(f"layers {range_text(layers)} are not in the model, whose {num_layers} layers are "
                             f"0-{num_layers - 1}")
        if self.index == last and layers.stop != num_layers:
            raise ValueError(f"stage {self.index} (the last of {last + 1}) must end at the model's last layer "
                             f"{num_layers - 1}, its layers are {range_text(layers)}")
        return layers
