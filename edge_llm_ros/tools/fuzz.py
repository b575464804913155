"""Seeded fuzz traffic for the topics the edge-cloud nodes subscribe to.

Contract: :class:`Fuzzer` yields :class:`FuzzMessage` records (topic, type, CDR bytes, what answer
a correct node gives) and knows nothing about the transport: the reliability harness publishes
them raw, tests check the mix on its own. Same seed, same messages.

Kinds of message, on every subscribed topic (``draft``, ``prune``, ``verify``, ``instruction``):

* ``bytes``: random bytes (rarely valid CDR);
* ``truncated``: a valid message cut short;
* ``mutated``: a valid message with a few random bytes changed (it may still deserialize, with
  strange values);
* ``invalid``: well-formed CDR whose values break the contract (a DraftTree field out of range,
  a request id of 25 kB, NaN probabilities, a tree past the context window, an unknown request,
  an empty or oversized instruction ...). Each DraftTree of this kind names the field at fault
  in ``expect`` and must be answered by a VerifyResult whose ``error`` names it (or says busy);
* ``valid``: a well-formed round-0 DraftTree with a fresh request id (it starts a request when
  the verifier has room, otherwise it is refused as busy), or a short real instruction.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

TOPICS = {
    "draft": "edge_llm_ros/msg/DraftTree",
    "prune": "edge_llm_ros/msg/PruneInfo",
    "verify": "edge_llm_ros/msg/VerifyResult",
    "instruction": "std_msgs/msg/String",
}
BIG_ID_CHARS = 25_000  # the memory repro: unique 25 kB ids
LONG_INSTRUCTION_CHARS = 40_000  # tokenizes past SmolLM2's 8192-token window


@dataclass
class FuzzMessage:
    topic: str  # relative to the deployment's namespace
    ros_type: str
    data: bytes
    kind: str  # bytes | truncated | mutated | invalid | valid
    request_id: str = ""  # a DraftTree's id (to match its answer)
    expect: str = ""  # DraftTree: the field its error must name, "answer" (outcomes or busy), "" (no answer owed)


def _draft(request_id: str, **fields) -> dict:  # fields may replace request_id too
    """A valid round-0 chain draft of two tokens after a three-token prompt, with ``fields`` changed."""
    base = {"request_id": request_id, "round": 0, "context_ids": [1, 2, 3], "prefix_len": 3, "token_ids": [5, 6],
            "parents": [-1, 0], "draft_probs": [0.5, 0.5]}
    base.update(fields)
    return base


# DraftTree faults: (field the error must name, fields to set). Each is a contract violation the
# verifier must refuse with a clear error, the request untouched.
def _draft_faults(rng: random.Random, vocab: int, window: int) -> list[tuple[str, dict]]:
    nan = float("nan")
    return [
        ("parents", {"parents": [rng.randint(1, 50), 0]}),
        ("parents", {"parents": [-1]}),
        ("draft_probs", {"draft_probs": [nan, 0.5]}),
        ("draft_probs", {"draft_probs": [1.5, -0.25]}),
        ("draft_probs", {"draft_probs": [0.5]}),
        ("token_ids", {"token_ids": [vocab + rng.randint(0, 10**6), 6]}),
        ("token_ids", {"token_ids": [-rng.randint(1, 100), 6]}),
        ("token_ids", {"token_ids": [5, 5], "parents": [-1, -1]}),  # siblings repeat a token
        ("context_ids", {"context_ids": [1, vocab + 7, 3]}),
        ("topk_ids", {"topk": 3}),
        ("topk_probs", {"topk": 1, "topk_ids": [5, 6], "topk_probs": [0.5, 0.5]}),
        ("temperature", {"temperature": -1.0}),
        ("temperature", {"temperature": nan}),
        ("top_p", {"top_p": 1.5}),
        ("top_p", {"top_p": nan}),
        ("prefix_len", {"prefix_len": rng.randint(4, 10**6)}),
        ("request_id", {"round": rng.randint(1, 1000)}),  # an unknown request past round 0
        ("request_id", {"request_id": ""}),
        ("request_id", {"request_id": "x" * BIG_ID_CHARS + uuid.UUID(int=rng.getrandbits(128)).hex}),
        ("cloud_tokens", {"cloud_tokens": rng.randint(1, 100)}),
        ("assumed_ids", {"assumed_ids": [5, 6]}),  # round 0 cannot be speculative
        ("task", {"task": f"fuzz-task-{rng.randint(0, 10**6)}"}),  # a task the verifier does not serve
        ("task", {"task": "t" * rng.randint(65, 300)}),
        ("image_features", {"image_features": [0.5] * rng.randint(1, 64)}),  # an image without a task
        ("token_ids", {"token_ids": [7] * window, "parents": list(range(-1, window - 1)),
                       "draft_probs": [0.5] * window}),  # a chain past the context window
    ]


class Fuzzer:
    """``messages(count)``: seeded fuzz traffic; ``vocab``/``window`` are the target's (SmolLM2's by default)."""

    def __init__(self, seed: int = 0, vocab: int = 49152, window: int = 8192, valid_every: int = 20,
                 instruction_every: int = 1000) -> None:
        from edge_llm_ros.runtime.interfaces import registry

        self.rng = random.Random(seed)
        self.vocab, self.window = vocab, window
        self.valid_every, self.instruction_every = valid_every, instruction_every
        self.registry = registry()
        self._faults = _draft_faults(random.Random(seed), vocab, window)
        self._count = 0

    def messages(self, count: int) -> Iterator[FuzzMessage]:
        topics = list(TOPICS)
        weights = [0.45, 0.15, 0.25, 0.15]
        for _ in range(count):
            self._count += 1
            topic = self.rng.choices(topics, weights)[0]
            yield self._one(topic)

    def _one(self, topic: str) -> FuzzMessage:
        rng, ros_type = self.rng, TOPICS[topic]
        roll = rng.random()
        if roll < 0.1:
            return FuzzMessage(topic, ros_type, rng.randbytes(rng.randint(0, 300)), "bytes")
        if topic == "draft":
            return self._draft_message(roll)
        values, kind = self._structured(topic)
        data = self.registry.serialize(self.registry.from_dict(ros_type, values), ros_type)
        if roll < 0.2:
            return FuzzMessage(topic, ros_type, data[: rng.randint(0, max(0, len(data) - 1))], "truncated")
        if roll < 0.3:
            return FuzzMessage(topic, ros_type, self._mutate(data), "mutated")
        return FuzzMessage(topic, ros_type, data, kind)

    def _fresh_id(self) -> str:
        return f"fuzz-{uuid.UUID(int=self.rng.getrandbits(128)).hex[:16]}"

    def _draft_message(self, roll: float) -> FuzzMessage:
        rng, ros_type = self.rng, TOPICS["draft"]
        rid = self._fresh_id()
        if self._count % self.valid_every == 0:
            values, kind, expect = _draft(rid, token_ids=[rng.randrange(self.vocab) for _ in range(2)]), "valid", "answer"
            if values["token_ids"][0] == values["token_ids"][1]:
                values["token_ids"][1] = (values["token_ids"][1] + 1) % self.vocab
        else:
            expect, changes = rng.choice(self._faults)
            values, kind = _draft(**{"request_id": rid, **changes}), "invalid"
            rid = values["request_id"]
        data = self.registry.serialize(self.registry.from_dict(ros_type, values), ros_type)
        if roll < 0.2:
            return FuzzMessage("draft", ros_type, data[: rng.randint(0, len(data) - 1)], "truncated")
        if roll < 0.3:
            return FuzzMessage("draft", ros_type, self._mutate(data), "mutated")
        return FuzzMessage("draft", ros_type, data, kind, rid, expect)

    def _structured(self, topic: str) -> tuple[dict, str]:
        rng = self.rng
        if topic == "prune":
            return {"request_id": self._fresh_id(), "round": rng.randrange(2**32), "prefix_len": rng.randrange(2**32),
                    "keep": [rng.randrange(2**32) for _ in range(rng.randint(0, 8))],
                    "release": rng.random() < 0.5}, "invalid"
        if topic == "verify":
            odd = [float("nan"), float("inf"), -1.0, 2.0, 0.5]
            return {"request_id": rng.choice(["", self._fresh_id(), "y" * 1000]), "round": rng.randrange(2**32),
                    "final": rng.random() < 0.5, "exit_layer": rng.randrange(2**32), "confidence": rng.choice(odd),
                    "accepted_nodes": [rng.randint(-5, 50) for _ in range(rng.randint(0, 6))],
                    "accepted_ids": [rng.randint(-5, self.vocab + 5) for _ in range(rng.randint(0, 6))],
                    "next_token": rng.randint(-(2**31), 2**31 - 1), "probs": [rng.choice(odd)],
                    "error": rng.choice(["", "boom"]), "verify_time_s": rng.choice(odd)}, "invalid"
        # instruction
        if self._count % self.instruction_every == 0:
            return {"data": rng.choice(["Say hello.", "Name a color.", "Count to three."])}, "valid"
        choice = rng.random()
        if choice < 0.4:
            text = ""
        elif choice < 0.5:
            text = "".join(rng.choice("abc xyz ") for _ in range(LONG_INSTRUCTION_CHARS))
        else:
            text = "".join(chr(rng.choice([rng.randint(32, 126), rng.randint(0x80, 0x2FFF)]))
                           for _ in range(rng.randint(1, 40)))
        return {"data": text}, "invalid"

    def _mutate(self, data: bytes) -> bytes:
        raw = bytearray(data)
        for _ in range(self.rng.randint(1, 4)):
            if raw:
                raw[self.rng.randrange(len(raw))] = self.rng.randrange(256)
        return bytes(raw)
