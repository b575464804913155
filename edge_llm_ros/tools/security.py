"""`edge-llm-ros security`: keystores from SROS2 policies, as `ros2 security` and zenoh_security_tools make them.

    edge-llm-ros security create KEYSTORE --policy config/security/go2_sim.xml [--domain-id N]
        the CA (kept if KEYSTORE has one), one identity per enclave and the router, and the Zenoh
        configs: KEYSTORE/zenoh/<enclave>.json5 (ZENOH_SESSION_CONFIG_URI) and zenohd.json5
        (ZENOH_ROUTER_CONFIG_URI); then `edge-llm-ros launch go2_sim keystore:=KEYSTORE`
    edge-llm-ros security check KEYSTORE        every enclave's and the router's files, one line each
    edge-llm-ros security list KEYSTORE         the enclaves and the nodes each one runs
    edge-llm-ros security policy OUT.xml        a policy from the live graph (`ros2 security
        generate_policy`): one enclave per node, every topic and service it uses; a start for a
        least-privilege policy, to be read and trimmed by hand

The layout and what each file protects: runtime/security.py and docs/security.md.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from edge_llm_ros.runtime.security import (
    DEFAULT_SECURE_ENDPOINT,
    ROUTER_ENCLAVE,
    VALID_DAYS,
    Enclave,
    Keystore,
    SecurityError,
    check_secured_config,
    create_keystore,
    write_policy,
)

ROLE_OF_KIND = {"MP": "publish", "MS": "subscribe", "SS": "reply", "SC": "request"}


def cmd_create(args: argparse.Namespace) -> int:
    store = create_keystore(args.keystore, args.policy, domain_id=args.domain_id, endpoint=args.endpoint,
                            days=args.days, progress=lambda path: print(f"  enclave {path}", flush=True))
    print(f"keystore {store.root}: CA {store.ca_cert}, Zenoh configs in {store.router_config.parent}")
    print(f"  launch with keystore:={store.root}; a CLI as an enclave: --keystore {store.root} --enclave /operator")
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    store = Keystore(args.keystore)
    failed = 0
    for path in [e.path for e in store.enclaves()] + [f"/{ROUTER_ENCLAVE}"]:
        config = store.router_config if path == f"/{ROUTER_ENCLAVE}" else store.session_config(path)
        try:
            cn = check_secured_config(config)
            print(f"ok      {path}  (certificate CN {cn})")
        except SecurityError as exc:
            failed += 1
            print(f"FAILED  {path}: {exc}")
    return 1 if failed else 0


def cmd_list(args: argparse.Namespace) -> int:
    for enclave in Keystore(args.keystore).enclaves():
        print(f"{enclave.path}: {', '.join(enclave.nodes) or '(no node profile)'}")
    return 0


def cmd_policy(args: argparse.Namespace) -> int:
    from edge_llm_ros.runtime.cli import Session

    session = Session()
    try:
        own = session.node.get_fully_qualified_name()
        time.sleep(args.wait)  # the graph arrives as liveliness tokens; listen this long
        enclaves: dict[str, Enclave] = {}
        for entry in session.node.graph():
            fqn = entry.node_fqn
            if fqn == own:
                continue
            enclave = enclaves.setdefault(fqn, Enclave(fqn, [fqn]))
            role = ROLE_OF_KIND.get(entry.kind)
            if role:
                enclave.allow[role].add(entry.name)
    finally:
        session.close()
    if not enclaves:
        print("edge-llm-ros security policy: error: no node in the graph", file=sys.stderr)
        return 1
    write_policy(sorted(enclaves.values(), key=lambda e: e.path), args.out)
    print(f"wrote {args.out}: {len(enclaves)} enclave(s), one per node: {', '.join(sorted(enclaves))}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="edge-llm-ros security", description=__doc__.splitlines()[0])
    verbs = parser.add_subparsers(dest="verb", required=True)
    p = verbs.add_parser("create", help="a keystore and its Zenoh configs from a policy")
    p.add_argument("keystore")
    p.add_argument("--policy", required=True, help="an SROS2 policy file (config/security/*.xml)")
    p.add_argument("--domain-id", type=int, default=int(os.environ.get("ROS_DOMAIN_ID", "0")),
                   help="the ROS domain the rules name (default $ROS_DOMAIN_ID or 0)")
    p.add_argument("--endpoint", default=DEFAULT_SECURE_ENDPOINT,
                   help="the router's tls endpoint (default %(default)s)")
    p.add_argument("--days", type=int, default=VALID_DAYS, help="certificates valid this long (default %(default)s)")
    p.set_defaults(func=cmd_create)
    p = verbs.add_parser("check", help="check every enclave's certificate, key and CA")
    p.add_argument("keystore")
    p.set_defaults(func=cmd_check)
    p = verbs.add_parser("list", help="the enclaves and their nodes")
    p.add_argument("keystore")
    p.set_defaults(func=cmd_list)
    p = verbs.add_parser("policy", help="a policy from the live graph, one enclave per node")
    p.add_argument("out")
    p.add_argument("--wait", type=float, default=2.0, help="seconds to listen to the graph (default %(default)s)")
    p.set_defaults(func=cmd_policy)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except SecurityError as exc:
        print(f"edge-llm-ros security {args.verb}: error: {exc}", file=sys.stderr)
        return 2
