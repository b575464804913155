"""The `remote` backend: an OpenAI-compatible server generates (vLLM, SGLang, llama.cpp's server,
llama-cpp-python's, Ollama), for a fleet that outgrows one machine for plain serving.

Each request is one streamed completion: `/chat/completions` with the prompt as the user's message
(the server applies its model's chat template) when `chat_template` is true, else `/completions`
with the raw prompt; `stream: true`, read as server-sent events, each content delta a Chunk. Greedy
requests send temperature 0; sampled ones temperature, top_p, seed and top_k (an extension vLLM,
SGLang and llama.cpp's servers read). Mode `ar` only: speculative modes stay with the backends
that hold a draft (edge_llm_ros/modes.py). The server sends text, not token ids, so a remote
result's token_ids is empty and its token count is the server's own `usage` when it reports one.

A server that cannot be reached ends the request with PEER_GONE, one that does not answer for
`timeout_s` with TIMEOUT, one that refuses the request (4xx) with INVALID, one that is overloaded
(429, 503) with BUSY. Cancelling closes the connection; the server stops generating.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator

from edge_llm_ros.errors import Busy, Failed, Inactive, Invalid, PeerGone, PeerTimeout
from edge_llm_ros.nodes.backends import Chunk, Request, RequestStats, Worker
from edge_llm_ros.nodes.parameters import declare, param


@dataclasses.dataclass(frozen=True)
class RemoteParams:
    remote_url: str = param("http://127.0.0.1:8000/v1", "the server's OpenAI-compatible API root (…/v1)")
    remote_model: str = param("", "the model to ask for ('' = the first the server lists at /models)")
    api_key_env: str = param("OPENAI_API_KEY", "environment variable holding the server's API key, if it needs "
                                               "one (never a parameter: parameters are readable by anyone)")
    timeout_s: float = param(30.0, "seconds to wait for the server's next bytes before the request ends",
                             low=0.001)

    def __post_init__(self) -> None:
        if not self.remote_url.startswith(("http://", "https://")):
            raise ValueError(f"parameter 'remote_url' must start with http:// or https://, got {self.remote_url!r}")


class RemoteBackend:
    name = "remote"
    params = RemoteParams
    door_defaults: dict = {}
    default_mode = "ar"

    def __init__(self, node) -> None:
        self.node = node
        self.p = declare(node, RemoteParams)
        self.url = self.p.remote_url.rstrip("/")
        self.model = ""  # while configured
        self.gate = threading.Semaphore(node.door.max_requests)

    def load(self) -> str:
        listed = [m.get("id", "") for m in self.call("GET", "/models", None, self.p.timeout_s).get("data", [])]
        if self.p.remote_model and self.p.remote_model not in listed:
            raise ValueError(f"parameter 'remote_model': {self.url}/models lists {listed}, not "
                             f"{self.p.remote_model!r}")
        if not (self.p.remote_model or listed):
            raise ValueError(f"{self.url}/models lists no model: set remote_model")
        self.model = self.p.remote_model or listed[0]
        api = "chat completions" if self.node.door.chat_template else "completions"
        return f"ar on {self.model} at {self.url} (OpenAI-compatible {api}, streamed)"

    def unload(self) -> None:
        self.model = ""

    def start(self, request: Request, listener) -> Worker:
        if not self.model:
            raise Inactive(self.node.refusal() or "not configured")
        stats = RequestStats(mode="ar", backend=self.url)
        body = completion(self.model, request, self.node.door.max_new_tokens, self.node.door.chat_template)
        return Worker(request, self.steps(request, body, stats), listener, stats, self.gate)

    def steps(self, request: Request, body: dict, stats: RequestStats):
        """The streamed completion as Chunks; returns the finish reason (eos | length | stop)."""
        path = "/chat/completions" if "messages" in body else "/completions"
        reason = "eos"
        with self.open("POST", path, body, self.p.timeout_s) as response:
            for data in events(response, self.url):
                for choice in data.get("choices", []):
                    text = (choice.get("delta") or {}).get("content") if "messages" in body else choice.get("text")
                    if text:
                        yield Chunk([], text)
                    reason = finish_reason(choice.get("finish_reason"), body) or reason
                stats.tokens = int((data.get("usage") or {}).get("completion_tokens", stats.tokens))
        return reason

    # -- HTTP --------------------------------------------------------------------------------------

    def headers(self) -> dict:
        key = os.environ.get(self.p.api_key_env, "")
        return {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}

    def open(self, method: str, path: str, body: dict | None, timeout: float):
        """The server's response to one call; the request's error (module docstring) if it fails."""
        data = None if body is None else json.dumps(body).encode()
        call = urllib.request.Request(self.url + path, data=data, method=method, headers=self.headers())
        try:
            return urllib.request.urlopen(call, timeout=timeout)  # noqa: S310 - the URL is the operator's parameter
        except urllib.error.HTTPError as exc:
            raise http_error(exc, self.url + path) from None
        except (socket.timeout, TimeoutError) as exc:
            raise PeerTimeout(f"{self.url}{path}: no answer within timeout_s={timeout:g} s") from exc
        except (urllib.error.URLError, OSError) as exc:
            raise PeerGone(f"cannot reach {self.url}{path}: {getattr(exc, 'reason', exc)}") from exc

    def call(self, method: str, path: str, body: dict | None, timeout: float) -> dict:
        """One call's JSON answer; ValueError saying why at configure."""
        try:
            with self.open(method, path, body, timeout) as response:
                return json.loads(response.read() or b"{}")
        except (Busy, Failed, Invalid, PeerGone, PeerTimeout, json.JSONDecodeError) as exc:
            raise ValueError(f"parameter 'remote_url': {exc}") from exc


def completion(model: str, request: Request, max_new_tokens: int, chat: bool) -> dict:
    """The streamed completion's body: the prompt (as the user's message when ``chat``), the token
    limit and the sampling settings; a greedy request sends temperature 0 and no other warp.
    `repeat_penalty` 1.0 (off): llama-cpp-python's and Ollama's servers penalise repeats by 1.1 by
    default, which changes even a greedy answer (measured on SmolLM2: "... is a map." at 1.0, "... is
    the ability to perceive ..." at 1.1); the target's own distribution has no penalty. Servers that do
    not know the field ignore it."""
    o = {"max_new_tokens": max_new_tokens, **request.overrides}
    body = {"model": model, "stream": True, "max_tokens": o["max_new_tokens"], "temperature": o.get("temperature", 0.0),
            "repeat_penalty": 1.0}
    if body["temperature"] > 0:
        body["top_p"] = o.get("top_p", 1.0)
        if o.get("top_k"):
            body["top_k"] = o["top_k"]
    if o.get("seed") is not None:
        body["seed"] = o["seed"]
    if o.get("stop_strings"):
        body["stop"] = list(o["stop_strings"])
    if chat:
        body["messages"] = [{"role": "user", "content": request.prompt}]
    else:
        body["prompt"] = request.prompt
    return body


def events(response, where: str) -> Iterator[dict]:
    """The JSON payloads of a server-sent event stream, until `[DONE]` or the end; a read that times
    out is PeerTimeout, an error payload Failed."""
    data: list[str] = []
    while True:
        try:
            line = response.readline()
        except (socket.timeout, TimeoutError) as exc:
            raise PeerTimeout(f"{where}: the stream stalled (timeout_s)") from exc
        if not line:
            return
        line = line.decode("utf-8").rstrip("\r\n")
        if line.startswith("data:"):
            data.append(line[5:].strip())
            continue
        if line or not data:  # a comment, another field, or a blank line without data
            continue
        payload, data = "\n".join(data), []
        if payload == "[DONE]":
            return
        event = json.loads(payload)
        if "error" in event:
            raise Failed(f"{where}: {event['error']}")
        yield event


def finish_reason(reason: str | None, body: dict) -> str:
    """OpenAI's finish reason as the front door's: length, stop (a stop string hit) or eos."""
    if reason == "length":
        return "length"
    if reason == "stop":
        return "stop" if body.get("stop") else "eos"  # the API does not tell a stop string from the end
    return ""


def http_error(exc: urllib.error.HTTPError, where: str) -> Exception:
    """An HTTP error status as the request's error: 429 and 503 busy, other 4xx invalid, else failed."""
    try:
        detail = exc.read().decode("utf-8", "replace")[:300]
    except OSError:
        detail = ""
    text = f"{where}: HTTP {exc.code} {exc.reason}{': ' + detail if detail else ''}"
    if exc.code in (429, 503):
        return Busy(text)
    return Invalid(text) if 400 <= exc.code < 500 else Failed(text)
