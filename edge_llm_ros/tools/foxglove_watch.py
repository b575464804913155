"""A Foxglove WebSocket client that subscribes to every channel and counts what arrives: the load an
operator's Foxglove app puts on foxglove_bridge_node (bench --scenario serving --foxglove).

It speaks the protocol's JSON text frames (serverInfo, advertise, unadvertise, subscribe) and counts
the binary message-data frames (opcode 1) without decoding them; a channel advertised later is
subscribed when it appears. The decoding check is test_foxglove's, with Foxglove's own client.
"""

from __future__ import annotations

import json
import threading

SUBPROTOCOL = "foxglove.sdk.v1"  # foxglove-sdk 0.30's (the frames of foxglove.websocket.v1)
MESSAGE_DATA = 1  # the first byte of a server's binary message-data frame


class FoxgloveWatcher:
    """``with FoxgloveWatcher(url) as w:`` ... ``w.messages``, ``w.bytes``, ``w.channels``."""

    def __init__(self, url: str, connect_timeout: float = 30.0) -> None:
        self.url, self.connect_timeout = url, connect_timeout
        self.messages = self.bytes = 0
        self.channels: dict[int, str] = {}  # channel id -> topic
        self.subscribed: set[int] = set()
        self.stop = threading.Event()
        self.ready = threading.Event()  # the first advertise was answered with subscriptions
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True, name="foxglove-watch")

    def __enter__(self) -> FoxgloveWatcher:
        self.thread.start()
        if not self.ready.wait(self.connect_timeout):
            self.stop.set()
            raise TimeoutError(f"no channels advertised by {self.url} within {self.connect_timeout:g} s"
                               + (f" ({self.error})" if self.error else ""))
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join(10)

    def _run(self) -> None:
        from websockets.sync.client import connect

        try:
            with connect(self.url, subprotocols=[SUBPROTOCOL], max_size=None, open_timeout=self.connect_timeout) as ws:
                while not self.stop.is_set():
                    try:
                        frame = ws.recv(timeout=0.2)
                    except TimeoutError:
                        continue
                    if isinstance(frame, bytes):
                        if frame[:1] == bytes([MESSAGE_DATA]):
                            self.messages += 1
                            self.bytes += len(frame)
                    else:
                        self._on_text(ws, json.loads(frame))
        except Exception as exc:  # noqa: BLE001 - reported by __enter__ or the caller
            self.error = exc

    def _on_text(self, ws, message: dict) -> None:
        if message.get("op") == "advertise":
            new = []
            for channel in message["channels"]:
                self.channels[channel["id"]] = channel["topic"]
                if channel["id"] not in self.subscribed:
                    self.subscribed.add(channel["id"])
                    new.append({"id": channel["id"], "channelId": channel["id"]})
            if new:
                ws.send(json.dumps({"op": "subscribe", "subscriptions": new}))
            self.ready.set()
        elif message.get("op") == "unadvertise":
            for channel_id in message["channelIds"]:
                self.channels.pop(channel_id, None)
