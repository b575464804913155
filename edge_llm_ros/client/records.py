"""What the client hands back: plain records, no message classes (so a program never depends on
the runtime that carried them).

- :class:`Chunk`: one piece of a streamed answer (a Generate feedback message);
- :class:`Stats`: the request's figures, InferenceStats' fields but the header;
- :class:`Result`: the answer (text, token ids, finish reason, status code, stats);
- :class:`Episode`: a navigator episode's summary (navigator_node's latched ``~/episode`` JSON).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

from edge_llm_ros.errors import Status

_CASTS = {"str": str, "int": int, "float": float, "bool": bool}


@dataclass(frozen=True)
class Chunk:
    """Tokens the server accepted in one step, the text they add, the target's probability of each
    (empty where the server does not send them), when it arrived here (time.monotonic()), and
    ``filled``: True for the one chunk a stream takes from the result, of what never came as feedback."""

    token_ids: list[int]
    text: str
    probs: list[float] = field(default_factory=list)
    at: float = 0.0
    filled: bool = False

    @classmethod
    def from_feedback(cls, feedback: Any, at: float) -> Chunk:
        return cls([int(t) for t in feedback.token_ids], str(feedback.text_delta), [float(p) for p in feedback.probs],
                   at)


@dataclass(frozen=True)
class Stats:
    """msg/InferenceStats as plain values, its header's stamp as ``stamp`` (seconds since the epoch);
    see the message for each field."""

    stamp: float = 0.0
    node_name: str = ""
    request_id: str = ""
    mode: str = ""
    backend: str = ""
    tokens: int = 0
    tokens_per_s: float = 0.0
    ttft_s: float = 0.0
    tau: float = 0.0
    acceptance_rate: float = 0.0
    draft_time_s: float = 0.0
    verify_time_s: float = 0.0
    cache_miss_rate: float = 0.0
    avg_exit_layer: float = 0.0
    active_requests: int = 0
    alt: float = 0.0
    alr: float = 0.0
    drafts: int = 0
    draft_forwards: int = 0
    draft_time_is_cpu: bool = False
    ignored_results: int = 0

    @classmethod
    def from_msg(cls, msg: Any) -> Stats:
        """The fields of an InferenceStats message (either runtime's class), each as its Python type."""
        values = {f.name: _CASTS[str(f.type)](getattr(msg, f.name)) for f in dataclasses.fields(cls)
                  if f.name != "stamp" and hasattr(msg, f.name)}
        stamp = msg.header.stamp
        return cls(stamp=stamp.sec + stamp.nanosec * 1e-9, **values)


@dataclass(frozen=True)
class Result:
    """A finished request. ``status`` is OK for an answer (``finish_reason`` eos | length | stop);
    a request that failed raises instead, carrying its Result as ``exc.result`` (the text so far)."""

    text: str
    token_ids: list[int]
    finish_reason: str
    status: Status = Status.OK
    stats: Stats = field(default_factory=Stats)

    @classmethod
    def from_msg(cls, result: Any) -> Result:
        """The Generate result message (either runtime's class) as a record."""
        code = int(result.status.code)
        status = Status(code) if code in Status._value2member_map_ else Status.FAILED
        return cls(str(result.text), [int(t) for t in result.token_ids], str(result.finish_reason), status,
                   Stats.from_msg(result.stats))


EPISODE_KEYS = ("episode", "instruction", "outcome", "actions", "overlap", "waiting_s", "waited_rounds",
                "first_motion_s")


@dataclass(frozen=True)
class Episode:
    """How a navigator episode ended (navigator_node's summary): its number, the instruction, the
    outcome (e.g. ``stop``, ``replaced``, a failure's reason), actions handed to the robot, whether
    decisions overlapped motion, seconds the robot stood waiting for decisions (and in how many
    rounds), seconds to its first motion (None: it never moved). ``extra``: keys beyond these."""

    episode: int
    instruction: str
    outcome: str
    actions: int = 0
    overlap: bool = False
    waiting_s: float = 0.0
    waited_rounds: int = 0
    first_motion_s: float | None = None
    extra: dict = field(default_factory=dict)

    @classmethod
    def from_json(cls, text: str) -> Episode:
        """The summary's JSON; ValueError naming what is missing or malformed."""
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"episode summary is not JSON ({exc.msg}): {text[:80]!r}") from None
        if not isinstance(data, dict) or not {"episode", "instruction", "outcome"} <= data.keys():
            raise ValueError(f"episode summary lacks episode, instruction or outcome: {text[:80]!r}")
        known = {k: data[k] for k in EPISODE_KEYS if k in data}
        return cls(**known, extra={k: v for k, v in data.items() if k not in EPISODE_KEYS})
