"""How a request ends, for programs: msg/RequestStatus's codes, and one exception per failing code.

A node's backend raises these (nodes/backends), the front door turns them into the Generate result's
``status`` (and the last TokenChunk's), and the client library (edge_llm_ros.client) raises them
again from a result's status, so a program catches the same class on either side of the wire:

    try:
        text = llm.generate("Which way is the kitchen?").text
    except Busy:
        ...  # try again later: max_requests running and max_pending waiting

:class:`Status` mirrors msg/RequestStatus.msg (test/runtime/test_interfaces.py checks they agree).
Knows nothing about ROS.
"""

from __future__ import annotations

import enum


class Status(enum.IntEnum):
    OK = 0          # answered: finish_reason eos | length | stop
    BUSY = 1        # refused: max_requests running and max_pending waiting
    INACTIVE = 2    # refused: the node is not active (its lifecycle state)
    INVALID = 3     # refused: a field out of range, an empty or too long prompt, a mode the node does not serve
    TIMEOUT = 4     # a peer (verifier, stage, remote server) did not answer in time
    PEER_GONE = 5   # a peer left, refused or failed while the request ran
    CANCELLED = 6   # cancelled by its client, or its client left
    FAILED = 7      # anything else


class RequestError(Exception):
    """A request that did not end with an answer; ``status`` says how, the message says why. A peer's
    refusal carries the peer's code (``status``: a verifier that was busy makes the request BUSY)."""

    status = Status.FAILED

    def __init__(self, message: str = "", status: int | None = None) -> None:
        super().__init__(message)
        if status:
            self.status = Status(status)


class Busy(RequestError):
    status = Status.BUSY


class Inactive(RequestError):
    status = Status.INACTIVE


class Invalid(RequestError, ValueError):
    status = Status.INVALID


class PeerTimeout(RequestError, TimeoutError):
    status = Status.TIMEOUT


class PeerGone(RequestError):
    status = Status.PEER_GONE


class Cancelled(RequestError):
    status = Status.CANCELLED


class Failed(RequestError):
    status = Status.FAILED


ERRORS = {cls.status: cls for cls in (Busy, Inactive, Invalid, PeerTimeout, PeerGone, Cancelled, Failed)}


def status_of(exc: BaseException) -> Status:
    """The code of an exception that ended a request: its own, else INVALID for a ValueError (a bad
    field, as GenerationConfig and the goal checks raise them), else FAILED."""
    if isinstance(exc, RequestError):
        return exc.status
    return Status.INVALID if isinstance(exc, ValueError) else Status.FAILED


def error_for(status: int, message: str) -> RequestError:
    """The exception a request that ended with ``status`` (not OK) raises in a client."""
    return ERRORS.get(Status(status) if status in Status._value2member_map_ else Status.FAILED, Failed)(message)
