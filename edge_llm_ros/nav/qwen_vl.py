"""Qwen2-VL / Qwen2.5-VL as the navigator's VLM: the user's own checkpoints, read from local folders.

Contract: :class:`QwenVL` gives a :class:`~edge_llm_ros.nav.navigator.Navigator` what the
trained adapter (nav/vlm.py) gives it, for a Qwen VLM: the prompt, and per frame a view of the
target (and of the draft) conditioned on the frame. The frame goes through qwen-vl-utils
(``process_vision_info``: RGB, resized to multiples of the patch grid) and the checkpoint's own
processor (the chat template, the image's patches and grid), as the models' authors run them;
each model's own vision tower then makes the image rows (core/engine/vision_lm.py), so the target is
exactly the checkpoint, and every lossless mode is lossless for it. The draft (Qwen2-VL-2B beside a
7B target, as in EE §4.4) shares the target's tokenizer and processor.

Frames are resized to one configured size, so every prompt holds the same number of image tokens
and the prompt of an instruction is made once. Over edge-cloud the robot sends that resized frame
(:meth:`QwenVL.features`, h x w x 3 values) with round 0, and the server conditions its target on
it through the same path (:meth:`QwenVL.condition_on`), so both halves read the same pixels.
qwen-vl-utils imports torchvision: install the ``vlm`` extra where a torchvision matching the
installed torch exists (``make vlm`` on the CPU-only dev machines). Knows nothing about ROS.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import numpy as np
import torch

from edge_llm_ros.core.engine.vision_lm import MRopeLM, load_vision_lm
from edge_llm_ros.nav.actions import ACTIONS, REASON_CHARS

PATCH_FACTOR = 28  # Qwen2-VL and Qwen2.5-VL: 14-pixel patches merged 2 x 2

# What the model is told; the action grammar (nav/actions.py) holds it to exactly this form.
TASK = ("You steer a quadruped robot from its front camera. Instruction: {instruction}\n"
        "Answer with a short reason (lowercase, at most {chars} characters) on one line, then one action:\n"
        "reason: <why>\naction: <one of {actions}>")


def require_vlm_extra():
    """qwen_vl_utils, or ImportError saying what to install: it is missing, or the torchvision it
    imports is not built for the installed torch."""
    try:
        import qwen_vl_utils
    except Exception as exc:  # ModuleNotFoundError, or torchvision's "operator torchvision::nms does not exist"
        raise ImportError(f"a Qwen VLM needs the vlm extra: qwen-vl-utils and a torchvision built for the installed "
                          f"torch (pip install -e '.[engine,vlm]'; on the CPU-only dev machines make vlm, then "
                          f".venv-vlm): {type(exc).__name__}: {exc}") from exc
    return qwen_vl_utils


@dataclass(frozen=True)
class QwenImageSize:
    """The size frames are resized to (pixels; qwen-vl-utils rounds each to its patch factor, 28)."""

    height: int = 252
    width: int = 336


class QwenVL:
    """A Qwen VLM for the navigator: ``processor`` (the target checkpoint's) and the image size.
    Models are :class:`MRopeLM`; :meth:`load` reads them from folders."""

    folder = None  # no task exits of its own (nav/navigator.nav_exits)
    training_info: dict = {}

    def __init__(self, processor, size: QwenImageSize | None = None) -> None:
        smart_resize = require_vlm_extra().smart_resize
        self.processor = processor
        self.config = size or QwenImageSize()
        # the pixels a frame is resized to (qwen-vl-utils rounds each side to its patch factor)
        self.shape = (*smart_resize(self.config.height, self.config.width, factor=PATCH_FACTOR), 3)
        self._image_prompt: list[int] | None = None  # a prompt's part up to the image's end is the same for all

    @classmethod
    def load(cls, target: str | os.PathLike, draft: str | os.PathLike | None = None,
             size: QwenImageSize | None = None) -> tuple[QwenVL, MRopeLM, MRopeLM | None]:
        """(the VLM, the target, the draft or None) from local checkpoint folders. A robot whose
        target runs elsewhere loads its draft as ``target`` (the processor comes with it)."""
        require_vlm_extra()  # before loading any weights
        target_lm, processor = load_vision_lm(target)
        draft_lm = None
        if draft:
            draft_lm, draft_processor = load_vision_lm(draft)
            tokens = len(processor.tokenizer)
            if (len(draft_processor.tokenizer) != tokens or draft_lm.image_token_id != target_lm.image_token_id
                    or min(draft_lm.vocab_size, target_lm.vocab_size) < tokens):
                raise ValueError(f"draft {draft} reads other tokens than target {target} ({len(draft_processor.tokenizer)} "
                                 f"tokens against {tokens}): a draft must share the target's tokenizer")
            if draft_lm.vocab_size != target_lm.vocab_size:  # heads padded differently (Qwen2-VL 2B and 7B)
                draft_lm = draft_lm.with_width(target_lm.vocab_size)
            draft_lm.tokenizer = target_lm.tokenizer
        return cls(processor, size), target_lm, draft_lm

    def describe(self) -> str:
        return f"Qwen VLM through qwen-vl-utils, frames at {self.config.width}x{self.config.height}"

    # -- what the navigator asks ------------------------------------------------------------------

    def attach(self, lm: MRopeLM, model: str) -> MRopeLM:
        """The checkpoint is the model: nothing to merge (the trained adapter's LoRA goes here)."""
        return lm

    def image(self, frame: np.ndarray) -> dict:
        """``frame`` (RGB uint8 [H, W, 3], any size) as a chat message's image, at this VLM's size."""
        from PIL import Image

        c = self.config
        return {"type": "image", "image": Image.fromarray(np.ascontiguousarray(frame)), "resized_height": c.height,
                "resized_width": c.width}

    def inputs(self, frame: np.ndarray, instruction: str = "") -> dict:
        """The processor's tensors for ``frame`` and ``instruction``: input_ids, pixel_values,
        image_grid_thw."""
        from qwen_vl_utils import process_vision_info

        image = self.image(frame)
        text = TASK.format(instruction=instruction.strip(), chars=REASON_CHARS, actions=", ".join(ACTIONS))
        messages = [{"role": "user", "content": [image, {"type": "text", "text": text}]}]
        prompt = self.processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        images, _ = process_vision_info(messages)
        return self.processor(text=[prompt], images=images, return_tensors="pt")

    def prompt_ids(self, tokenizer, instruction: str) -> list[int]:
        """The prompt's token ids: the chat template around the image's tokens and the task."""
        return self.inputs(np.zeros(self.shape, np.uint8), instruction)["input_ids"][0].tolist()

    def features(self, frame: np.ndarray) -> torch.Tensor:
        """``frame`` resized as qwen-vl-utils resizes it, [h, w, 3] values 0-255: what a robot sends
        its verifier with round 0 (each model's own vision tower reads it there)."""
        from qwen_vl_utils import fetch_image

        image = fetch_image(self.image(frame))
        return torch.from_numpy(np.asarray(image, dtype=np.uint8).copy()).float()

    def condition(self, lm: MRopeLM, frame: np.ndarray, model: str = "target") -> MRopeLM:
        """A view of ``lm`` whose prompt's image tokens are ``frame`` (see MRopeLM.with_image)."""
        return self.condition_on(lm, self.features(frame), model)

    def condition_on(self, lm: MRopeLM, features, model: str = "target") -> MRopeLM:
        """:meth:`condition` from the frame's :meth:`features` (or their values, row-major); ValueError
        naming the expected size if they are not h x w x 3 values in 0-255."""
        values = torch.as_tensor(features, dtype=torch.float32)
        if values.numel() != math.prod(self.shape) or not bool(((values >= 0) & (values <= 255)).all()):
            raise ValueError(f"the image must be {self.shape[1]} x {self.shape[0]} RGB values in 0-255 "
                             f"({math.prod(self.shape)} values: this VLM's frame size), got {values.numel()}")
        frame = values.reshape(self.shape).round().to(torch.uint8).numpy()
        batch = self.inputs(frame)
        if self._image_prompt is None:
            self._image_prompt = batch["input_ids"][0].tolist()
        return lm.with_image(self._image_prompt, batch["pixel_values"], batch["image_grid_thw"])
