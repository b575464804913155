"""Camera frames from their wire fields to RGB arrays, with a clear error for each bad one.

sensor_msgs/Image (encoding rgb8, bgr8, rgba8, bgra8 or mono8; ``step`` bytes per row, at least
width x channels; ``height`` rows) and sensor_msgs/CompressedImage (``format`` jpeg or png, decoded
with OpenCV). A frame that is empty, mis-sized or in another encoding raises :class:`FrameError`
naming the field: the navigator logs it and the robot stops. Knows nothing about ROS.
"""

from __future__ import annotations

import numpy as np

CHANNELS = {"rgb8": 3, "bgr8": 3, "rgba8": 4, "bgra8": 4, "mono8": 1}


class FrameError(ValueError):
    """A frame that cannot be used; the message starts with the field at fault."""


def from_raw(encoding: str, width: int, height: int, step: int, data: bytes | np.ndarray) -> np.ndarray:
    """RGB uint8 [height, width, 3] from an Image message's fields."""
    if encoding not in CHANNELS:
        raise FrameError(f"encoding: expected one of {sorted(CHANNELS)}, got {encoding!r}")
    if width <= 0 or height <= 0:
        raise FrameError(f"width, height: expected a non-empty frame, got {width} x {height}")
    channels = CHANNELS[encoding]
    if step < width * channels:
        raise FrameError(f"step: {step} bytes per row is less than width x channels = {width * channels}")
    buffer = np.frombuffer(bytes(data) if not isinstance(data, np.ndarray) else data.tobytes(), dtype=np.uint8)
    if buffer.size != step * height:
        raise FrameError(f"data: expected step x height = {step * height} bytes, got {buffer.size}")
    rows = buffer.reshape(height, step)[:, : width * channels].reshape(height, width, channels)
    if encoding == "mono8":
        return np.repeat(rows, 3, axis=2)
    if encoding.startswith("bgr"):
        rows = rows[:, :, 2::-1]
    return np.ascontiguousarray(rows[:, :, :3])


def from_compressed(format: str, data: bytes | np.ndarray) -> np.ndarray:
    """RGB uint8 [H, W, 3] from a CompressedImage's fields (jpeg or png)."""
    import cv2

    kind = format.split(";")[0].strip().lower()
    if kind not in ("jpeg", "jpg", "png", "rgb8", "bgr8"):
        raise FrameError(f"format: expected jpeg or png, got {format!r}")
    buffer = np.frombuffer(bytes(data) if not isinstance(data, np.ndarray) else data.tobytes(), dtype=np.uint8)
    if buffer.size == 0:
        raise FrameError("data: empty")
    image = cv2.imdecode(buffer, cv2.IMREAD_COLOR)  # BGR
    if image is None:
        raise FrameError(f"data: {buffer.size} bytes that OpenCV cannot decode as {kind}")
    return np.ascontiguousarray(image[:, :, ::-1])
