"""A small vision-language model for the navigator, built on the LLM the package already runs.

LLaVA-style: a small CNN encodes the camera frame into ``tokens`` feature vectors, and a projector
per language model maps them into that model's embedding space (SmolLM2's for the target, the
draft's for the draft: the shipped draft shares SmolLM2's embeddings, but it gets its own
projector, trained to agree with the target). The image's rows take the places of ``tokens``
reserved token ids in the prompt (special tokens a chat never uses; SmolLM2: ids 3-10), through
:meth:`TorchCausalLM.with_embeddings`, so the image enters the engine like token embeddings and
every decoding mode, lossless ones included, works with images unchanged.

Each language model may also carry a low-rank update of some of its weights (LoRA: W + (alpha /
rank) B A on the attention's q and v projections), trained with the adapter so the LM learns to
read the image rows. :meth:`NavAdapter.attach` merges it into a copy of those weights (every other
weight stays shared), so the VLM's target is "SmolLM2 + this adapter", decoded by the engine like
any model, and lossless modes stay lossless for it.

    adapter = NavAdapter.load(path)                         # encoder + projectors + LoRA + prompt format
    vlm_target = adapter.attach(target, "target")           # merged LoRA, weights otherwise shared
    ids = adapter.prompt_ids(tokenizer, "go to the red chair")
    target_view = adapter.condition(vlm_target, frame, "target")  # a TorchCausalLM view
    draft_view = adapter.condition(adapter.attach(draft_model, "draft"), frame, "draft")

On disk, a directory: ``config.json`` (format, image size, token count, reserved ids, the
target's identity, training metadata) and ``adapter.safetensors``. Knows nothing about ROS.
"""

from __future__ import annotations

import copy
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import nn

from edge_llm_ros import DATA
from edge_llm_ros.core.engine.models import TorchCausalLM

ADAPTER_FORMAT = "edge_llm_ros.nav_adapter/1"
CONFIG_FILE, WEIGHTS_FILE = "config.json", "adapter.safetensors"
ADAPTERS_DIR = DATA / "nav"
DEFAULT_ADAPTER = "smollm2-nav"
CAMERA = "Camera:"


@dataclass(frozen=True)
class AdapterConfig:
    """The image format and the prompt's image slots. ``height`` x ``width``: what the encoder
    sees (frames are resized to it); ``reserved_ids``: one token id per image row."""

    height: int = 96
    width: int = 128
    channels: int = 64
    reserved_ids: tuple[int, ...] = tuple(range(3, 11))
    hidden: dict[str, int] = field(default_factory=lambda: {"target": 576, "draft": 576})
    # per model, the adapted linear layers and their [out, in] shapes ({}: no LoRA; see lora_shapes)
    lora: dict[str, dict[str, list[int]]] = field(default_factory=dict)
    lora_rank: int = 8
    lora_alpha: float = 16.0

    @property
    def tokens(self) -> int:
        return len(self.reserved_ids)

    def __post_init__(self) -> None:
        if self.tokens != 8:
            raise ValueError(f"reserved_ids: the encoder makes 8 image rows (2 x 4), got {self.tokens} ids")


class VisionEncoder(nn.Module):
    """[B, 3, H, W] in [0, 1] -> [B, 8, C]: four convolutions (three strided) pooled to a 2 x 4 grid (the
    columns keep the bearing of what is seen), one row per cell, plus a learned position per cell.
    Two coordinate planes (column and row, -1..1) join the colour planes, so features can say where
    in a cell something is: "ahead" is a 10-degree band, a cell is 22."""

    def __init__(self, channels: int = 64) -> None:
        super().__init__()
        c = channels
        self.convs = nn.Sequential(
            nn.Conv2d(5, c // 2, 5, stride=2, padding=2), nn.GELU(),       # [B, C/2, H/2, W/2]
            nn.Conv2d(c // 2, c, 3, stride=2, padding=1), nn.GELU(),       # [B, C, H/4, W/4]
            nn.Conv2d(c, c, 3, stride=2, padding=1), nn.GELU(),            # [B, C, H/8, W/8]
            nn.Conv2d(c, c, 3, stride=1, padding=1), nn.GELU(),            # [B, C, H/8, W/8]
            nn.AdaptiveAvgPool2d((2, 4)),                                  # [B, C, 2, 4]
        )
        self.position = nn.Parameter(torch.zeros(8, c))

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        b, _, h, w = images.shape
        ys = torch.linspace(-1, 1, h, dtype=images.dtype).view(1, 1, h, 1).expand(b, 1, h, w)
        xs = torch.linspace(-1, 1, w, dtype=images.dtype).view(1, 1, 1, w).expand(b, 1, h, w)
        grid = self.convs(torch.cat([images, xs, ys], dim=1))  # [B, C, 2, 4]
        return grid.flatten(2).transpose(1, 2) + self.position  # [B, 8, C]


class LowRank(nn.Module):
    """A LoRA update of one linear layer's weight: W -> W + (alpha / rank) B A, B starting at zero
    (so training starts from the unchanged LM). Also a parametrization (torch.nn.utils.parametrize)
    for training through the LM's own modules."""

    def __init__(self, out_features: int, in_features: int, rank: int, alpha: float) -> None:
        super().__init__()
        self.a = nn.Parameter(torch.randn(rank, in_features) / in_features ** 0.5)
        self.b = nn.Parameter(torch.zeros(out_features, rank))
        self.scale = alpha / rank

    def forward(self, weight: torch.Tensor) -> torch.Tensor:
        return weight + (self.scale * self.b @ self.a).to(weight.dtype)


def lora_shapes(lm: TorchCausalLM, names: tuple[str, ...] = ("q_proj", "v_proj")) -> dict[str, list[int]]:
    """{module path: [out, in]} of the ``names`` linear layers of every decoder layer of ``lm``."""
    return {path: list(module.weight.shape) for path, module in lm.hf.named_modules()
            if path.rsplit(".", 1)[-1] in names and isinstance(module, nn.Linear)}


def _key(path: str) -> str:
    return path.replace(".", "/")  # module names may not hold dots


class NavAdapter(nn.Module):
    """The encoder and one projector per language model (see the module docstring)."""

    def __init__(self, config: AdapterConfig | None = None, identity: dict | None = None,
                 training: dict | None = None) -> None:
        super().__init__()
        self.config = config or AdapterConfig()
        self.identity = identity or {}
        self.training_info = training or {}
        self.folder: Path | None = None  # where it was loaded from (its task exits live there too)
        self.encoder = VisionEncoder(self.config.channels)
        self.projectors = nn.ModuleDict({
            name: nn.Sequential(nn.Linear(self.config.channels, width), nn.GELU(), nn.Linear(width, width))
            for name, width in self.config.hidden.items()
        })
        c = self.config
        self.lora = nn.ModuleDict({
            name: nn.ModuleDict({_key(path): LowRank(*shape, c.lora_rank, c.lora_alpha) for path, shape in layers.items()})
            for name, layers in c.lora.items() if layers
        })

    # -- frames and prompts -----------------------------------------------------------------------

    def preprocess(self, frames: np.ndarray | list[np.ndarray]) -> torch.Tensor:
        """RGB uint8 frames [H, W, 3] (any size) -> [B, 3, h, w] floats in [0, 1]."""
        import cv2

        batch = frames if isinstance(frames, list) else [frames]
        size = (self.config.width, self.config.height)
        resized = [cv2.resize(np.ascontiguousarray(f), size, interpolation=cv2.INTER_AREA) for f in batch]
        return torch.from_numpy(np.stack(resized)).permute(0, 3, 1, 2).float() / 255.0

    def prompt_ids(self, tokenizer, instruction: str) -> list[int]:
        """The prompt: "Camera:", the image's reserved ids, the instruction on its own line; the
        answer follows (the action grammar, nav/actions.py). Short on purpose: training runs
        the frozen target over every prompt token."""
        encode = lambda s: tokenizer.encode(s, add_special_tokens=False)  # noqa: E731
        return encode(CAMERA) + list(self.config.reserved_ids) + encode(f"\nInstruction: {instruction.strip()}\n")

    # -- the language models --------------------------------------------------------------------

    def attach(self, lm: TorchCausalLM, model: str, trainable: bool = False) -> TorchCausalLM:
        """``lm`` as this adapter's ``model`` ("target" or "draft"): ``lm`` itself without LoRA;
        else a model over a copy of its module tree that shares every weight except the adapted
        ones, which hold W + BA merged (``trainable``: computed from the live LoRA parameters on
        every use, for training); weights ``lm`` does not hold (a pipeline stage's other layers, on
        the meta device) stay as they are. ``lm`` itself is never changed."""
        updates = self.lora[model] if model in self.lora else {}
        if not updates:
            return lm
        from torch.nn.utils import parametrize

        shared = {id(t): t for t in [*lm.hf.parameters(), *lm.hf.buffers()]}
        clone = copy.deepcopy(lm.hf, shared)
        for key, low in updates.items():
            linear = clone.get_submodule(key.replace("/", "."))
            if linear.weight.is_meta:  # a pipeline stage's model holds its own layers only (core/pipeline/stages.py)
                continue
            if trainable:
                parametrize.register_parametrization(linear, "weight", low)
            else:
                with torch.no_grad():
                    linear.weight = nn.Parameter(low(linear.weight.detach()), requires_grad=False)
        view = TorchCausalLM(clone, lm.tokenizer, lm.layer_ids, transposed_head=lm._head_copy is not None)
        view._head_copy = lm._head_copy  # the head is shared, so is its transposed copy
        return view

    # -- image rows -------------------------------------------------------------------------------

    def rows(self, images: torch.Tensor, model: str) -> torch.Tensor:
        """[B, 3, h, w] -> [B, 8, E] rows in ``model``'s embedding space."""
        return self.projectors[model](self.encoder(images))

    @torch.inference_mode()
    def features(self, frame: np.ndarray) -> torch.Tensor:
        """``frame``'s encoder features [8, C], shared by every model's projector: what a robot
        sends its verifier in place of the frame (2 kB at C = 64)."""
        return self.encoder(self.preprocess(frame))[0]

    @torch.inference_mode()
    def condition(self, lm: TorchCausalLM, frame: np.ndarray, model: str = "target") -> TorchCausalLM:
        """A view of ``lm`` in which the prompt's reserved ids embed as ``frame``'s rows."""
        return self.condition_on(lm, self.features(frame), model)

    @torch.inference_mode()
    def condition_on(self, lm: TorchCausalLM, features: torch.Tensor, model: str = "target") -> TorchCausalLM:
        """:meth:`condition` from the frame's :meth:`features` [8, C] (or their 8 * C values, row-major);
        ValueError naming the expected size if they are not that."""
        c = self.config
        features = torch.as_tensor(features, dtype=torch.float32)
        if features.numel() != c.tokens * c.channels or not bool(torch.isfinite(features).all()):
            raise ValueError(f"image features must be {c.tokens} x {c.channels} finite values (this adapter's "
                             f"encoder), got {features.numel()}")
        rows = self.projectors[model](features.reshape(c.tokens, c.channels))  # [8, E]
        return lm.with_embeddings({i: rows[k] for k, i in enumerate(c.reserved_ids)})

    # -- files ------------------------------------------------------------------------------------

    def save(self, folder: str | os.PathLike) -> Path:
        from safetensors.torch import save_file

        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        config = {"format": ADAPTER_FORMAT, **asdict(self.config), "target": self.identity,
                  "training": self.training_info}
        (folder / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
        save_file({k: v.detach().contiguous() for k, v in self.state_dict().items()}, str(folder / WEIGHTS_FILE))
        return folder

    @classmethod
    def load(cls, folder: str | os.PathLike | None = None, target: TorchCausalLM | None = None) -> NavAdapter:
        """The adapter in ``folder`` (None: the shipped one for SmolLM2); with ``target``, refuse a
        target other than the one it was trained for (naming what differs)."""
        from safetensors.torch import load_file

        folder = ADAPTERS_DIR / DEFAULT_ADAPTER if folder is None else Path(folder)
        path = folder / CONFIG_FILE
        if not path.is_file():
            raise FileNotFoundError(f"no navigation adapter in {folder} (no {CONFIG_FILE}); train one with: "
                                    "edge-llm-ros train nav")
        raw = json.loads(path.read_text())
        if raw.get("format") != ADAPTER_FORMAT:
            raise ValueError(f"{path}: format {raw.get('format')!r}, expected {ADAPTER_FORMAT!r}")
        config = AdapterConfig(raw["height"], raw["width"], raw["channels"], tuple(raw["reserved_ids"]),
                               dict(raw["hidden"]), dict(raw.get("lora", {})), int(raw.get("lora_rank", 8)),
                               float(raw.get("lora_alpha", 16.0)))
        adapter = cls(config, raw.get("target", {}), raw.get("training", {}))
        if target is not None:
            check_identity(adapter.identity, target, folder)
        adapter.load_state_dict(load_file(str(folder / WEIGHTS_FILE)))
        adapter.folder = folder
        return adapter.eval()


def check_identity(identity: dict, target: TorchCausalLM, where: os.PathLike) -> None:
    from edge_llm_ros.core.engine.models import target_identity

    ours = target_identity(target)
    differ = [k for k in identity if k in ours and identity[k] != ours[k]]
    if differ:
        raise ValueError(f"navigation adapter {where} was trained for another target: "
                         + ", ".join(f"{k} {identity[k]!r} != {ours[k]!r}" for k in differ))
