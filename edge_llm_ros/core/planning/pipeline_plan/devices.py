"""The inputs of a pipeline plan: the target's shape and bytes, the devices and what a layer costs on
each, and τ, the tokens a verification of a draft tree yields.

Contract: :func:`model_shape` reads a Hugging Face folder's config.json and safetensors headers
(nothing is loaded); a :class:`DeviceSpec` holds a device's memory budget, its link and its
costs (given in ms by row count, or this machine's LayerProfile times a factor, measured at
first use); :func:`read_devices` reads a devices file (config/devices.example.yaml),
:func:`default_devices` makes this machine's cores into devices. Knows nothing about ROS.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml

from ..costs import LayerProfile, Link
from ..partition import ModelCost, size_text

DEFAULT_LINK = Link(latency_s=1e-3, bandwidth_bps=1e9)  # the default devices' emulated link

RowCurve = Callable[[np.ndarray], np.ndarray]  # seconds for `rows` rows, elementwise


def row_curve(points: Mapping[int, float]) -> RowCurve:
    """Seconds by row count off a few points: linear between them and beyond the ends along the
    nearest two, never below zero (one point: that cost at every row count)."""
    xs = np.array(sorted(points), dtype=np.float64)
    ys = np.array([points[x] for x in sorted(points)], dtype=np.float64)
    if len(xs) == 1:
        return lambda rows: np.full(np.shape(rows), ys[0])

    def at(rows):
        x = np.asarray(rows, dtype=np.float64)
        i = np.clip(np.searchsorted(xs, x, side="right") - 1, 0, len(xs) - 2)
        return np.maximum(ys[i] + (ys[i + 1] - ys[i]) * (x - xs[i]) / (xs[i + 1] - xs[i]), 0.0)

    return at


# -- the target -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelShape:
    """What planning needs of the target: its shape and bytes (weights as stored; the KV cache is
    2 · kv_heads · head_dim · dtype bytes per row and layer), and the shipped draft's size."""

    num_layers: int
    hidden_size: int
    kv_heads: int
    head_dim: int
    vocab_size: int
    dtype_bytes: int
    layer_bytes: tuple[int, ...]  # weights of each decoder layer
    embed_bytes: int  # the embedding (first stage)
    head_bytes: int  # final norm + LM head (last stage; the embedding again when tied)
    draft_layers: int = 4
    draft_vocab: int = 8192

    def kv_bytes(self, context: int) -> int:
        return 2 * self.kv_heads * self.head_dim * self.dtype_bytes * context

    def cost(self, context: int) -> ModelCost:
        """What each stage holds for one request of ``context`` rows (Jupiter: weights + KV cache)."""
        kv = self.kv_bytes(context)
        return ModelCost([w + kv for w in self.layer_bytes], self.embed_bytes, self.head_bytes)

    @property
    def head_layers(self) -> float:
        """The head's weights in decoder layers: its time where only a layer's is given."""
        return self.head_bytes / (sum(self.layer_bytes) / self.num_layers)


def safetensors_header(path: Path) -> dict[str, dict]:
    """Tensor name -> {dtype, shape, data_offsets}: a safetensors file's header (8-byte length, JSON)."""
    with open(path, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(length))
    header.pop("__metadata__", None)
    return header


def model_shape(folder: str | Path) -> ModelShape:
    """The shape and bytes of the Hugging Face model in ``folder`` (models.weights_folder gives
    SmolLM2's) as stage_node loads it (core/engine/partial.stage_tensor_names), and the shipped draft's."""
    from ...drafts.draft_models import default_draft_path

    folder = Path(folder)
    config = json.loads((folder / "config.json").read_text())
    tensors: dict[str, dict] = {}
    for path in sorted(folder.glob("*.safetensors")):
        tensors.update(safetensors_header(path))
    if not tensors:
        raise FileNotFoundError(f"no .safetensors files in {folder}")
    size = {name: t["data_offsets"][1] - t["data_offsets"][0] for name, t in tensors.items()}
    layer_bytes = [0] * config["num_hidden_layers"]
    for name, nbytes in size.items():
        parts = name.split(".")
        if "layers" in parts:
            layer_bytes[int(parts[parts.index("layers") + 1])] += nbytes
    embed = sum(b for n, b in size.items() if n.endswith("embed_tokens.weight"))
    head = sum(b for n, b in size.items() if n.startswith("lm_head.") or n == "model.norm.weight")
    if not any(n.startswith("lm_head.") for n in size):
        head += embed  # a head tied to the embedding: the last stage loads the embedding
    heads = config["num_attention_heads"]
    dtype = tensors[next(n for n in tensors if "layers" in n)]["dtype"]
    draft = json.loads((default_draft_path() / "config.json").read_text())
    return ModelShape(len(layer_bytes), config["hidden_size"], config.get("num_key_value_heads", heads),
                      config.get("head_dim") or config["hidden_size"] // heads, config["vocab_size"],
                      {"F16": 2, "BF16": 2}.get(dtype, 4), tuple(layer_bytes), embed, head, draft["num_layers"],
                      draft.get("vocab_subset") or config["vocab_size"])


# -- the devices ----------------------------------------------------------------------------------


class ProfileCost:
    """A device's costs from this machine's LayerProfile times ``scale``; ``profile`` may be a function
    that measures it, called at the first cost asked for (so a plan refused for memory measures nothing)."""

    def __init__(self, profile: LayerProfile | Callable[[], LayerProfile], scale: float = 1.0) -> None:
        self.profile, self.scale, self.curves = profile, scale, None

    def costs(self) -> tuple:
        """(q(rows, cached), head(rows)) of one layer and the head, unscaled."""
        if self.curves is None:
            profile = self.profile if isinstance(self.profile, LayerProfile) else self.profile()
            self.curves = profile.q(), row_curve(dict(zip(profile.rows, profile.head_s)))
        return self.curves

    def layer(self, rows, cached) -> np.ndarray:
        return self.scale * self.costs()[0](rows, cached)

    def head(self, rows) -> np.ndarray:
        return self.scale * self.costs()[1](rows)


@dataclass(frozen=True)
class DeviceSpec:
    """One device of the pipeline: its memory budget (weights + KV cache), its link to the next
    device (the last device's: back to the first, where D0 drafts), and what a decoder layer
    costs there: ``layer(rows, cached)`` seconds, elementwise (a core/planning/partition RowCost), and the
    final norm + head ``head(rows)`` (None: as many layers' time as its weights weigh)."""

    name: str
    memory_bytes: int
    link: Link
    layer: Callable[[np.ndarray, np.ndarray], np.ndarray]
    head: RowCurve | None = None
    threads: int = 0  # torch threads it was measured with (0: not measured here)
    source: str = ""

    @classmethod
    def profiled(cls, name: str, profile: LayerProfile | Callable[[], LayerProfile], memory_bytes: int,
                 link: Link = DEFAULT_LINK, scale: float = 1.0, threads: int | None = None) -> DeviceSpec:
        """Costs from a LayerProfile of this machine (or a function measuring it at first use, see
        :class:`ProfileCost`), times ``scale`` (2: twice as slow)."""
        cost = ProfileCost(profile, scale)
        threads = profile.threads if isinstance(profile, LayerProfile) else threads or 0
        source = (profile.source if isinstance(profile, LayerProfile) else
                  f"measured here, {threads} thread{'s' * (threads != 1)}") + (f", x{scale:g}" if scale != 1 else "")
        return cls(name, memory_bytes, link, cost.layer, cost.head, threads, source)

    @classmethod
    def tabled(cls, name: str, layer_ms: Mapping[int, float], memory_bytes: int, link: Link = Link(),
               head_ms: Mapping[int, float] | None = None, source: str = "given") -> DeviceSpec:
        """Costs given in ms by row count (at the planned context, whatever the cached rows)."""
        layer = row_curve({r: ms / 1e3 for r, ms in layer_ms.items()})
        head = row_curve({r: ms / 1e3 for r, ms in head_ms.items()}) if head_ms else None
        return cls(name, memory_bytes, link, lambda r, c: layer(r), head, 0, source)

    def head_s(self, model: ModelShape, rows) -> np.ndarray:
        if self.head is not None:
            return self.head(rows)
        return model.head_layers * self.layer(np.asarray(rows), np.zeros_like(np.asarray(rows)))


# -- τ ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AcceptanceCurve:
    """τ(W): the tokens one verification of a W-node draft tree yields (accepted + the target's
    own), linear between the points, flat beyond the last (no more than was seen); τ(0) = 1."""

    nodes: tuple[int, ...]
    tokens: tuple[float, ...]
    source: str

    def __post_init__(self):
        nodes = list(self.nodes)
        if len(nodes) != len(self.tokens) or not nodes or nodes != sorted(set(nodes)) or nodes[0] < 1:
            raise ValueError(f"nodes must ascend from 1, one tokens value each; got {self.nodes}, {self.tokens}")
        if min(self.tokens) < 1:
            raise ValueError(f"a verification yields at least the target's own token: tokens >= 1, got {self.tokens}")

    def __call__(self, width: int) -> float:
        return float(np.interp(width, [0, *self.nodes], [1.0, *self.tokens]))

    @classmethod
    def measured(cls, measurements) -> AcceptanceCurve | None:
        """From a device plan's measurements (core.planning.planner.Measurements): τ of sd at γ as a chain of
        γ nodes, of each tree at its width; the best at each width (None: no draft measured)."""
        best: dict[int, float] = {}
        for draft in measurements.drafts:
            points = [*draft.tau.items(), *((t.spec.width, t.tau) for t in draft.trees)]
            for width, tau in points:
                best[int(width)] = max(best.get(int(width), 1.0), float(tau))
        if not best:
            return None
        nodes, tokens = sorted(best), np.maximum.accumulate([best[w] for w in sorted(best)])
        return cls(tuple(nodes), tuple(float(t) for t in tokens),
                   "measured: the device plan's τ of the shipped draft (sd per γ, tree per width)")


# Ghidorah Table I, MT-bench: acceptance length of Medusa on Vicuna-7B at verification widths 1..64
# (the root counted: width w verifies w - 1 drafted nodes). Not our draft: an assumption.
GHIDORAH = AcceptanceCurve((1, 3, 7, 15, 31, 63), (1.72, 2.28, 2.59, 2.93, 3.19, 3.34),
                           "assumed: Ghidorah Table I (MT-bench, Medusa on Vicuna-7B), not measured here")


# -- a devices file -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Devices:
    """The devices in pipeline order, and what D0 needs: ``draft_s`` seconds per draft forward (a
    tree level; None: the shipped draft's layers and head on the first device) and τ (None: the
    planner's)."""

    devices: tuple[DeviceSpec, ...]
    acceptance: AcceptanceCurve | None = None
    draft_s: float | None = None
    source: str = ""


def available_memory() -> int:
    """Bytes of memory available now (Linux MemAvailable; else free pages)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def default_devices(profile: LayerProfile | Callable[[], LayerProfile], count: int = 2, threads: int = 1) -> Devices:
    """``count`` devices that are this machine's cores: ``threads`` each as ``profile`` measured them
    (or a function measuring them at first use), the available memory shared evenly, an emulated
    1 Gbit/s, 1 ms link between them."""
    memory = available_memory() // count
    devices = tuple(DeviceSpec.profiled(f"core{i}", profile, memory, threads=threads) for i in range(count))
    return Devices(devices, source=f"{count} x this machine's cores ({threads} thread{'s' * (threads != 1)} each, "
                                   f"measured here), {size_text(memory)} each (available memory / {count}), "
                                   f"emulated link {DEFAULT_LINK.describe()}")


DEVICE_KEYS = ("name", "memory_mb", "link", "layer_ms", "head_ms", "profile")


def read_devices(path: str | Path, measure: Callable[[int], LayerProfile]) -> Devices:
    """A devices file (config/devices.example.yaml shows every key). ``measure(threads)`` profiles
    this machine for devices that say ``profile:``, once per thread count, when a plan first needs
    their costs. ValueError naming the file, the device and the key for anything missing or malformed."""
    path = Path(path)
    try:
        doc = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ValueError(f"devices file {path}: cannot read it: {' '.join(str(exc).split())}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("devices"), list) or not doc["devices"]:
        raise ValueError(f"devices file {path}: expected a mapping with a non-empty list 'devices'")
    profiles: dict[int, LayerProfile] = {}

    def here(threads: int) -> LayerProfile:  # measured at first use, once per thread count
        if threads not in profiles:
            profiles[threads] = measure(threads)
        return profiles[threads]

    devices = []
    for i, entry in enumerate(doc["devices"]):
        where = f"devices file {path}: device {i}" + (f" ({entry.get('name')})" if isinstance(entry, dict) else "")
        try:
            devices.append(device_entry(entry, here))
        except KeyError as exc:
            raise ValueError(f"{where}: missing {exc}") from None
        except (TypeError, ValueError, AttributeError) as exc:
            raise ValueError(f"{where}: {exc}") from None
    names = [d.name for d in devices]
    if len(set(names)) != len(names):
        raise ValueError(f"devices file {path}: device names must differ, got {names}")
    acceptance = None
    if "acceptance" in doc:
        a = doc["acceptance"]
        try:
            acceptance = AcceptanceCurve(tuple(int(n) for n in a["nodes"]), tuple(float(t) for t in a["tokens"]),
                                         str(a.get("source", f"given in {path.name}")))
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"devices file {path}: acceptance: {exc}") from None
    draft_ms = doc.get("draft_ms")
    return Devices(tuple(devices), acceptance, None if draft_ms is None else float(draft_ms) / 1e3,
                   f"{path} ({len(devices)} devices)")


def ms_points(value) -> dict[int, float]:
    """``{rows: ms}`` as given, or one number: that cost at every row count; every cost > 0."""
    points = {int(r): float(ms) for r, ms in value.items()} if isinstance(value, dict) else {1: float(value)}
    if not points or min(points.values()) <= 0 or min(points) < 1:
        raise ValueError(f"costs are {{rows >= 1: ms > 0}} or one ms > 0, got {value!r}")
    return points


def device_entry(entry: dict, here: Callable[[int], LayerProfile]) -> DeviceSpec:
    """One entry of a devices file (``here(threads)``: this machine's profile, for ``profile:``)."""
    unknown = sorted(set(entry) - set(DEVICE_KEYS))
    if unknown:
        raise ValueError(f"unknown key(s) {', '.join(unknown)} (known: {', '.join(DEVICE_KEYS)})")
    name, memory = str(entry["name"]), int(float(entry["memory_mb"]) * 1e6)
    if memory <= 0:
        raise ValueError(f"memory_mb must be > 0, got {entry['memory_mb']}")
    link = entry.get("link") or {}
    bandwidth = float(link.get("bandwidth_mbps", 0)) * 1e6 or float("inf")
    link = Link(float(link.get("latency_ms", 0.0)) / 1e3, bandwidth)
    if ("layer_ms" in entry) == ("profile" in entry):
        raise ValueError("give either layer_ms (ms per decoder layer by rows) or profile (measured here)")
    if "profile" in entry:
        how = entry["profile"] or {}
        threads = int(how.get("threads", 1))
        return DeviceSpec.profiled(name, lambda: here(threads), memory, link, float(how.get("scale", 1.0)), threads)
    head_ms = entry.get("head_ms")
    return DeviceSpec.tabled(name, ms_points(entry["layer_ms"]), memory, link, ms_points(head_ms) if head_ms else None)
