"""The Zenoh router the embedded backend's nodes meet at (the rmw_zenohd role).

Nodes open Zenoh sessions in peer mode with multicast scouting off and
connect to one router, as rmw_zenoh does; discovery then travels through the
router's gossip. The endpoint comes from `EDGE_LLM_ZENOH_ROUTER`
(default tcp/127.0.0.1:7447, rmw_zenohd's default), so tests and parallel
deployments pick their own port.

Run one by hand with `python -m edge_llm_ros.runtime.router [--listen ENDPOINT]`; with
ZENOH_ROUTER_CONFIG_URI set (a keystore's zenoh/zenohd.json5) it is the secured router: tls/ only,
mutual TLS, the policy's access control (runtime/security.py).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
import threading

from edge_llm_ros.runtime.security import ROUTER_CONFIG_ENV, SecurityError, load_config

ENDPOINT_ENV = "EDGE_LLM_ZENOH_ROUTER"
DEFAULT_ENDPOINT = "tcp/127.0.0.1:7447"


def router_endpoint() -> str:
    return os.environ.get(ENDPOINT_ENV, DEFAULT_ENDPOINT)


def _host_port(endpoint: str) -> tuple[str, int]:
    proto, _, address = endpoint.partition("/")
    if proto not in ("tcp", "tls") or ":" not in address:
        raise ValueError(f"router endpoint must look like tcp/HOST:PORT or tls/HOST:PORT, got '{endpoint}'")
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


def router_reachable(endpoint: str | None = None, timeout: float = 0.5) -> bool:
    """True when something accepts TCP connections at the router endpoint."""
    host, port = _host_port(endpoint or router_endpoint())
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def free_endpoint() -> str:
    """A tcp endpoint on loopback with a port nobody listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"tcp/127.0.0.1:{sock.getsockname()[1]}"


def router_config(listen: str):
    """Loopback, multicast scouting off; with ZENOH_ROUTER_CONFIG_URI (a keystore's zenohd.json5:
    mTLS and the policy's access control, runtime/security.py) that file, listening on `listen`."""
    import zenoh

    secured = os.environ.get(ROUTER_CONFIG_ENV)
    if secured:
        return load_config(secured, listen=listen)
    conf = zenoh.Config()
    conf.insert_json5("mode", json.dumps("router"))
    conf.insert_json5("listen/endpoints", json.dumps([listen]))
    conf.insert_json5("scouting/multicast/enabled", "false")
    return conf


def serve(listen: str, ready: threading.Event | None = None, stop: threading.Event | None = None) -> None:
    """Run a router until `stop` is set; raises if the endpoint cannot be bound."""
    import zenoh

    stop = stop or threading.Event()
    session = zenoh.open(router_config(listen))
    try:
        if ready is not None:
            ready.set()
        stop.wait()
    finally:
        session.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="edge_llm_ros.runtime.router", description=__doc__.splitlines()[0])
    parser.add_argument("--listen", default=router_endpoint(), help="endpoint to listen on (default %(default)s)")
    args = parser.parse_args(argv)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    ready = threading.Event()
    ready_then_announce = threading.Thread(
        target=lambda: ready.wait() and print(f"zenoh router listening on {args.listen}", flush=True), daemon=True)
    ready_then_announce.start()
    try:
        serve(args.listen, ready, stop)
    except SecurityError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 2
    except Exception as exc:  # zenoh.ZError: address in use, bad endpoint
        print(f"error: cannot start a zenoh router on {args.listen}: {exc}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
