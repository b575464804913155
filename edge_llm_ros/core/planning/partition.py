"""Jupiter's parallelism planning (§IV-B): which layers each device runs, how to chunk a prompt.

Contract: profiles in, plans out; nothing is loaded, measured or sent here. Seconds and bytes
are whatever the profiler measured for the row count being planned.

* :func:`plan_layers` (Eq. 1) splits the L decoder layers into one contiguous stage per device,
  in the devices' order, minimising the slowest stage (a pipeline's steady-state period). Every
  device gets at least one layer; to leave a device out, leave it out of the list. A stage's
  time is its layers' times on its device, plus the embedding on the first stage, the final
  norm + LM head on the last, and the hop to the next device on every stage but the last.
  Those times are the device's own (:class:`StageDevice`); bytes are the model's
  (:class:`ModelCost`), since a layer weighs the same wherever it runs.
* :func:`plan_sequence` (Eq. 2-4) splits one prompt into k chunks fed into that pipeline one
  after another, each chunk attending to the cached rows of the chunks before it. For every k it
  balances the chunks' per-stage latency (Eq. 2-3), then keeps the k of least total latency
  (Eq. 4); :func:`sequence_plans` returns the candidate for every k.
* :func:`check_ranges` and :func:`check_memory` validate a given layer split before anything
  loads, naming the stages, layers and devices at fault.

Every failure is a :class:`PartitionError` (a ValueError) that says which device or stage and
by how much. Knows nothing about ROS.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

CHUNKS_PER_STAGE = 4  # Jupiter caps k at 4|D|: enough chunks to fill the pipeline, a bounded search

# q(rows, prefix) -> seconds one stage takes for `rows` new rows attending to `prefix` cached
# rows. Called elementwise with integer numpy arrays (one call per prompt length, not per
# entry), so it must broadcast like a ufunc; a polynomial or :func:`interpolated_cost` does.
RowCost = Callable[[np.ndarray, np.ndarray], np.ndarray]


class PartitionError(ValueError):
    """No split satisfies the constraints, or a given split breaks them (the message says where)."""


# -- inputs -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StageDevice:
    """One device of the pipeline, as profiled for the row count being planned.

    layer_s: seconds per decoder layer on this device (t_l^n), one per layer.
    link_s: seconds to send one stage output to the next device (not paid by the last stage).
    embed_s / head_s: seconds of the token embedding / final norm + LM head on this device,
    paid only if this device is the first / last stage.
    """

    name: str
    layer_s: Sequence[float]
    memory_bytes: int
    link_s: float = 0.0
    embed_s: float = 0.0
    head_s: float = 0.0

    def __post_init__(self):
        object.__setattr__(self, "layer_s", tuple(float(t) for t in self.layer_s))


@dataclass(frozen=True)
class ModelCost:
    """Bytes a stage must hold: per decoder layer (weights + KV cache at the planned context),
    and the embedding (first stage) and final norm + LM head (last stage)."""

    layer_bytes: Sequence[int]
    embed_bytes: int = 0
    head_bytes: int = 0

    def __post_init__(self):
        object.__setattr__(self, "layer_bytes", tuple(int(b) for b in self.layer_bytes))

    @property
    def num_layers(self) -> int:
        return len(self.layer_bytes)

    @property
    def total_bytes(self) -> int:
        return sum(self.layer_bytes) + self.embed_bytes + self.head_bytes


# -- outputs ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LayerPlan:
    """Stage n runs decoder layers ``ranges[n]`` on device ``devices[n]``."""

    devices: tuple[str, ...]
    ranges: tuple[range, ...]
    stage_s: tuple[float, ...]  # each stage's period, its link included
    stage_bytes: tuple[int, ...]

    @property
    def bottleneck_s(self) -> float:
        return max(self.stage_s)


@dataclass(frozen=True)
class SequencePlan:
    """A prompt fed as ``chunks`` (token counts, in order); chunk i attends to the ones before it."""

    chunks: tuple[int, ...]
    chunk_s: tuple[float, ...]  # h_i: chunk i's latency at each stage
    latency_s: float  # Eq. 4: the whole prompt through the pipeline

    @property
    def k(self) -> int:
        return len(self.chunks)

    @property
    def slowest_s(self) -> float:
        """W: the slowest chunk, which paces the pipeline once it is full."""
        return max(self.chunk_s)


# -- what one stage costs -----------------------------------------------------------------------


def fixed_seconds(device: StageDevice, stage: int, num_stages: int) -> float:
    """What a stage pays besides its decoder layers: embedding first, head last, the hop if not last."""
    last = stage == num_stages - 1
    return (device.embed_s if stage == 0 else 0.0) + (device.head_s if last else device.link_s)


def fixed_bytes(model: ModelCost, stage: int, num_stages: int) -> int:
    return (model.embed_bytes if stage == 0 else 0) + (model.head_bytes if stage == num_stages - 1 else 0)


def stage_seconds(device: StageDevice, layers: range, stage: int, num_stages: int) -> float:
    return sum(device.layer_s[layers.start : layers.stop]) + fixed_seconds(device, stage, num_stages)


def stage_bytes(model: ModelCost, layers: range, stage: int, num_stages: int) -> int:
    return sum(model.layer_bytes[layers.start : layers.stop]) + fixed_bytes(model, stage, num_stages)


def stage_table(device: StageDevice, model: ModelCost, stage: int, num_stages: int) -> np.ndarray:
    """T(i -> j, n) of Eq. 1 for every span at once: [L+1, L+1], entry (i, j) the seconds of
    layers i..j-1 on this device as stage ``stage``; +inf where the span is empty or its bytes
    exceed the device's budget (Jupiter: an unfitting stage costs +inf)."""
    seconds = np.concatenate([[0.0], np.cumsum(device.layer_s)])
    weight = np.concatenate([[0], np.cumsum(model.layer_bytes)])
    table = seconds[None, :] - seconds[:, None] + fixed_seconds(device, stage, num_stages)  # [i, j]
    held = weight[None, :] - weight[:, None] + fixed_bytes(model, stage, num_stages)
    starts, stops = np.indices(table.shape)
    table[(stops <= starts) | (held > device.memory_bytes)] = np.inf
    return table


# -- Eq. 1: layers to devices -------------------------------------------------------------------


def check_devices(devices: Sequence[StageDevice], model: ModelCost) -> None:
    num_layers = model.num_layers
    if not devices:
        raise PartitionError("no devices to partition the model over")
    for device in devices:
        if len(device.layer_s) != num_layers:
            raise PartitionError(
                f"{device.name} has {len(device.layer_s)} layer times for a {num_layers}-layer model"
            )
    if num_layers < len(devices):
        raise PartitionError(
            f"{num_layers} layers cannot fill {len(devices)} stages: every device needs at least one "
            f"layer (leave devices out instead)"
        )


def fewest_layers(model: ModelCost, stage: int, num_stages: int) -> range:
    """The lightest span a stage can hold: one layer (the first stage's is layer 0, the last's
    layer L-1, a middle stage's the lightest it can reach), or all of them for a lone stage."""
    last_layer = model.num_layers - 1
    if num_stages == 1:
        return range(0, model.num_layers)
    if stage == 0:
        return range(0, 1)
    if stage == num_stages - 1:
        return range(last_layer, last_layer + 1)
    reach = range(stage, model.num_layers - num_stages + stage + 1)
    lightest = min(reach, key=lambda layer: model.layer_bytes[layer])
    return range(lightest, lightest + 1)


def unfit_error(devices: Sequence[StageDevice], model: ModelCost) -> PartitionError:
    """Why no split fits: the device furthest over budget with its fewest layers, else the total."""
    num_layers, num_stages = model.num_layers, len(devices)
    head = f"no partition of {num_layers} layers fits"
    shortfalls = []
    for stage, device in enumerate(devices):
        layers = fewest_layers(model, stage, num_stages)
        need = stage_bytes(model, layers, stage, num_stages)
        shortfalls.append((need - device.memory_bytes, device, layers, stage, need))
    over, device, layers, stage, need = max(shortfalls, key=lambda s: s[0])
    if over > 0:
        return PartitionError(
            f"{head}: {device.name} needs at least {size_text(need)} for its fewest layers "
            f"({span_text(layers, stage, num_stages)}), budget {size_text(device.memory_bytes)}"
        )
    budgets = sum(d.memory_bytes for d in devices)
    if model.total_bytes > budgets:
        return PartitionError(
            f"{head}: the model needs {size_text(model.total_bytes)} with embedding and head, the "
            f"{num_stages} devices' budgets total {size_text(budgets)}"
        )
    return PartitionError(
        f"{head}: the {num_stages} devices' budgets total {size_text(budgets)} for the "
        f"{size_text(model.total_bytes)} needed, but no split at whole layers keeps every stage "
        f"within its device's budget"
    )


def plan_layers(devices: Sequence[StageDevice], model: ModelCost) -> LayerPlan:
    """Jupiter Eq. 1, the balanced pipeline over devices d_1..d_D in the given order:

        A(1 -> y, D_n) = min_{l < y} max{ A(1 -> l, D_{n-1}), T(l+1 -> y, d_n) }
    A: the slowest stage of the best split of the first y layers over the first n devices;
    T: one stage's seconds (+inf if its bytes exceed the device's budget). O(L^2 D).
    Raises PartitionError, naming the tightest device, when no split fits.
    """
    check_devices(devices, model)
    num_layers, num_stages = model.num_layers, len(devices)
    tables = [stage_table(device, model, n, num_stages) for n, device in enumerate(devices)]
    best = tables[0][0]  # [L+1]: A(1 -> y, D_1), the first device alone on layers 0..y-1
    cuts = []  # cuts[n-1][y]: where device n's layers start in the best split of layers 0..y-1
    for table in tables[1:]:
        spans = np.maximum(best[:, None], table)  # [l, y]: max(A(1 -> l, D_{n-1}), T(l+1 -> y, d_n))
        cut = spans.argmin(axis=0)
        best = spans[cut, np.arange(num_layers + 1)]
        cuts.append(cut)
    if not np.isfinite(best[num_layers]):
        raise unfit_error(devices, model)

    bounds = [num_layers]  # walk the cuts back from the last stage: [L, start of d_D, ..., start of d_2]
    for cut in reversed(cuts):
        bounds.append(int(cut[bounds[-1]]))
    bounds = [0] + bounds[::-1]
    ranges = tuple(range(start, stop) for start, stop in zip(bounds, bounds[1:]))
    return LayerPlan(
        devices=tuple(d.name for d in devices),
        ranges=ranges,
        stage_s=tuple(stage_seconds(d, r, n, num_stages) for n, (d, r) in enumerate(zip(devices, ranges))),
        stage_bytes=tuple(stage_bytes(model, r, n, num_stages) for n, r in enumerate(ranges)),
    )


# -- Eq. 2-4: a prompt into chunks --------------------------------------------------------------


def chunk_seconds(q: RowCost, chunks: Sequence[int]) -> np.ndarray:
    """h_i = q(|s_i|, |s_1| + ... + |s_{i-1}|): each chunk attends to the rows cached before it."""
    rows = np.asarray(chunks, dtype=np.int64)
    prefix = np.cumsum(rows) - rows
    return np.broadcast_to(np.asarray(q(rows, prefix), dtype=np.float64), rows.shape)


def pipeline_latency(chunk_s: np.ndarray, num_stages: int) -> float:
    """Jupiter Eq. 4: every chunk crosses one stage back to back, then the slowest chunk W
    paces the other D - 1 stages: sum(h_i) + (D - 1) * W."""
    return float(chunk_s.sum() + (num_stages - 1) * chunk_s.max())


def balance_chunks(q: RowCost, prompt_len: int, max_chunks: int, min_chunk: int) -> np.ndarray:
    """Jupiter Eq. 2-3 for k = 1..max_chunks and prefixes j = 0..prompt_len:

        W(1 -> j, k) = min_{l < j} max{ W(1 -> l, k-1), T*(j - l, l) }
        T*(x, l) = +inf if x < b, else q(x, l)
    Returns cuts [K+1, y+1]: cuts[k, j] is where the last chunk starts in the best split of
    tokens 0..j-1 into k chunks. Only j <= prompt_len is ever needed, and q is evaluated once
    per j, for every start l at once. O(K y^2), vectorised over k and l.
    """
    slowest = np.full((max_chunks + 1, prompt_len + 1), np.inf)  # W(1 -> j, k)  [k, j]
    slowest[0, 0] = 0.0  # no tokens in no chunks
    cuts = np.zeros((max_chunks + 1, prompt_len + 1), dtype=np.int64)
    rows = np.arange(max_chunks)
    for stop in range(min_chunk, prompt_len + 1):
        starts = np.arange(stop - min_chunk + 1)  # the last chunk is starts..stop-1, >= b tokens
        last = np.asarray(q(stop - starts, starts), dtype=np.float64)  # T*(stop - l, l)  [l]
        spans = np.maximum(slowest[:max_chunks, : len(starts)], last)  # [k-1, l]
        cut = spans.argmin(axis=1)  # the earliest l on a tie
        cuts[1:, stop] = cut
        slowest[1:, stop] = spans[rows, cut]
    return cuts


def split_at(cuts: np.ndarray, k: int, prompt_len: int) -> tuple[int, ...]:
    """Walk the cuts back from the end: the chunk lengths of the best split into k chunks."""
    chunks, stop = [], prompt_len
    for n in range(k, 0, -1):
        start = int(cuts[n, stop])
        chunks.append(stop - start)
        stop = start
    return tuple(chunks[::-1])


def costed(q: RowCost, chunks: Sequence[int], num_stages: int) -> SequencePlan:
    chunk_s = chunk_seconds(q, chunks)
    return SequencePlan(tuple(chunks), tuple(chunk_s.tolist()), pipeline_latency(chunk_s, num_stages))


def sequence_plans(prompt_len: int, q: RowCost, num_stages: int, min_chunk: int = 1) -> list[SequencePlan]:
    """The Eq. 2-3 balanced split for every k the search allows, k = 1 first.

    k runs from 1 to min(4 * num_stages, prompt_len // min_chunk); chunks shorter than
    ``min_chunk`` (b: too few rows to keep the accelerator busy) are never used. A prompt
    shorter than ``min_chunk`` still has to run: it is one chunk of its own length.
    """
    if prompt_len < 1:
        raise PartitionError("the prompt is empty: nothing to partition")
    if num_stages < 1 or min_chunk < 1:
        raise PartitionError(f"need at least one stage and min_chunk >= 1, got {num_stages} and {min_chunk}")
    if prompt_len < min_chunk:
        return [costed(q, (prompt_len,), num_stages)]
    max_chunks = min(CHUNKS_PER_STAGE * num_stages, prompt_len // min_chunk)
    cuts = balance_chunks(q, prompt_len, max_chunks, min_chunk)
    return [costed(q, split_at(cuts, k, prompt_len), num_stages) for k in range(1, max_chunks + 1)]


def plan_sequence(prompt_len: int, q: RowCost, num_stages: int, min_chunk: int = 1) -> SequencePlan:
    """Jupiter Eq. 4: of the balanced splits, the k of least pipeline latency (fewer chunks on a tie)."""
    return min(sequence_plans(prompt_len, q, num_stages, min_chunk), key=lambda plan: plan.latency_s)


def interpolated_cost(
    rows_grid: Sequence[int], prefix_grid: Sequence[int], seconds: Sequence[Sequence[float]]
) -> RowCost:
    """q from a profile measured on a grid: ``seconds[i][j]`` for ``rows_grid[i]`` new rows after
    ``prefix_grid[j]`` cached rows (both ascending, at least two points each). Bilinear between
    grid points and linear beyond them along the edge cells, so a prompt longer than the
    profile costs more rather than the same; never below zero."""
    rows_at = np.asarray(rows_grid, dtype=np.float64)
    prefix_at = np.asarray(prefix_grid, dtype=np.float64)
    table = np.asarray(seconds, dtype=np.float64)
    if table.shape != (len(rows_at), len(prefix_at)):
        raise ValueError(f"seconds has shape {table.shape}, the grid is {len(rows_at)} x {len(prefix_at)}")
    for name, grid in (("rows_grid", rows_at), ("prefix_grid", prefix_at)):
        if len(grid) < 2 or np.any(np.diff(grid) <= 0):
            raise ValueError(f"{name} needs at least two strictly ascending points, got {grid.tolist()}")

    def cell(grid: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The grid cell each x falls in (the edge cell beyond the ends) and x's offset in it."""
        i = np.clip(np.searchsorted(grid, x, side="right") - 1, 0, len(grid) - 2)
        return i, (x - grid[i]) / (grid[i + 1] - grid[i])

    def q(rows, prefix):
        i, u = cell(rows_at, np.asarray(rows, dtype=np.float64))
        j, v = cell(prefix_at, np.asarray(prefix, dtype=np.float64))
        value = (
            table[i, j] * (1 - u) * (1 - v)
            + table[i + 1, j] * u * (1 - v)
            + table[i, j + 1] * (1 - u) * v
            + table[i + 1, j + 1] * u * v
        )
        return np.maximum(value, 0.0)

    return q


# -- checks of a given split --------------------------------------------------------------------


def layers_text(start: int, stop: int) -> str:
    return f"layer {start}" if stop - start == 1 else f"layers {start}-{stop - 1}"


def layers_are(start: int, stop: int) -> str:
    """'layer 7 is' / 'layers 7-9 are': the subject of a check's message."""
    return f"{layers_text(start, stop)} {'is' if stop - start == 1 else 'are'}"


def span_text(layers: range, stage: int, num_stages: int) -> str:
    """'layers 0-3 + embedding': what a stage holds, in words."""
    text = layers_text(layers.start, layers.stop)
    if stage == 0:
        text += " + embedding"
    if stage == num_stages - 1:
        text += " + head"
    return text


def size_text(num_bytes: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if num_bytes >= scale:
            return f"{num_bytes / scale:.4g} {unit}"
    return f"{num_bytes} B"


def check_ranges(ranges: Sequence[range], num_layers: int) -> None:
    """Stages (numbered from 0) must be non-empty runs of consecutive layers, in ascending order,
    covering layers 0..num_layers-1 exactly once. Raises PartitionError naming stages and layers."""
    if not ranges:
        raise PartitionError("no stages given")
    for stage, layers in enumerate(ranges):
        if layers.step != 1:
            raise PartitionError(f"stage {stage} ({layers}) skips layers: a stage runs consecutive layers")
        if len(layers) == 0:
            raise PartitionError(f"stage {stage} ({layers}) holds no layers")
        if layers.start < 0 or layers.stop > num_layers:
            raise PartitionError(
                f"stage {stage} holds {layers_text(layers.start, layers.stop)} but the model has "
                f"{num_layers} layers (0-{num_layers - 1})"
            )
    for stage in range(1, len(ranges)):
        before, layers = ranges[stage - 1], ranges[stage]
        if layers.start < before.start:
            raise PartitionError(
                f"stages are not in ascending order: stage {stage} starts at layer {layers.start}, "
                f"before stage {stage - 1} (layer {before.start})"
            )
        if layers.start < before.stop:
            shared = layers_are(layers.start, min(before.stop, layers.stop))
            raise PartitionError(f"{shared} in stage {stage - 1} and stage {stage}")
        if layers.start > before.stop:
            raise PartitionError(f"{layers_are(before.stop, layers.start)} in no stage")
    if ranges[0].start > 0:
        raise PartitionError(f"{layers_are(0, ranges[0].start)} in no stage")
    if ranges[-1].stop < num_layers:
        raise PartitionError(f"{layers_are(ranges[-1].stop, num_layers)} in no stage")


def check_memory(ranges: Sequence[range], devices: Sequence[StageDevice], model: ModelCost) -> None:
    """Every stage within its device's budget, embedding on the first and head on the last;
    raises PartitionError listing each device over budget with its bytes and budget."""
    if len(ranges) != len(devices):
        raise PartitionError(f"{len(ranges)} stages for {len(devices)} devices: one stage per device")
    num_stages, over = len(ranges), []
    for stage, (device, layers) in enumerate(zip(devices, ranges)):
        need = stage_bytes(model, layers, stage, num_stages)
        if need > device.memory_bytes:
            over.append(
                f"{device.name} (stage {stage}, {span_text(layers, stage, num_stages)}) needs "
                f"{size_text(need)}, budget {size_text(device.memory_bytes)}"
            )
    if over:
        raise PartitionError("over memory budget: " + "; ".join(over))


_RANGE = re.compile(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?")


def layer_ranges(text: str) -> list[range]:
    """'0-10,11-29' -> [range(0, 11), range(11, 30)]: inclusive ranges, one per stage ('7' is 7-7;
    '' is none). ValueError naming the parameter for anything else."""
    if not text.strip():
        return []
    ranges = []
    for part in text.split(","):
        match = _RANGE.fullmatch(part)
        if match is None or int(match[1]) > int(match[2] or match[1]):
            raise ValueError(f"parameter 'layers' takes inclusive layer ranges a-b, comma-separated "
                             f"(e.g. 0-10,11-29), got {text!r}")
        ranges.append(range(int(match[1]), int(match[2] or match[1]) + 1))
    return ranges


def range_text(layers: range) -> str:
    return f"{layers.start}-{layers.stop - 1}"
