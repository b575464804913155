"""Secured links the way rmw_zenoh's security tools make them: an SROS2 keystore, per-enclave Zenoh configs.

An SROS2 policy (XML: enclaves, each with node profiles granting topics to publish or subscribe,
services to reply to or request, actions to execute or call) becomes a keystore:

    KEYSTORE/public/ca.cert.pem                the CA (identity and permissions CA in one, as
                                               `ros2 security create_keystore` makes it)
    KEYSTORE/private/ca.key.pem                its key: keep it off the robots
    KEYSTORE/enclaves/<enclave>/cert.pem       one identity per enclave, CN = the enclave's path,
                        key.pem, identity_ca.cert.pem, permissions_ca.cert.pem
                                               (the file names rmw_dds_common's get_security_files reads)
    KEYSTORE/enclaves/zenohd/...               the router's identity
    KEYSTORE/zenoh/<enclave>.json5             a session config per enclave: ZENOH_SESSION_CONFIG_URI
    KEYSTORE/zenoh/zenohd.json5                the router's: ZENOH_ROUTER_CONFIG_URI
    KEYSTORE/policy.xml                        the policy it was made from

What zenoh_security_tools' generate_configs writes, and where this differs:
- Links: `transport/link/tls` with `enable_mtls`, the CA as root, the enclave's certificate and key
  for both listening and connecting, `verify_name_on_connect: false`; endpoints on `tls/`. The
  same here.
- Access control: generate_configs puts `access_control` (default deny, rules on
  `<domain>/<name>/**` and on `@ros2_lv/<domain>/**`) into each node's own session config, which
  restrains an honest node only: a process holding a valid certificate can drop those lines. Here
  the router enforces the same rules too, per enclave, matching each link by its certificate's
  common name (`cert_common_names`), and the node sessions are Zenoh clients (no listening
  endpoint, no peer links), so every sample passes the router and its rules. Each session config
  keeps its own rules as well (defence in depth, the same builder).
- Rules cover what the embedded backend sends for a topic: puts, and for transient-local topics
  zenoh-ext's publication caches (queryables, replies, liveliness under the topic's key). Actions
  map to their services and topics (rcl_action's `_action/...` names), which generate_configs
  leaves out.

`edge-llm-ros security create|policy|check` (tools/security.py) drives it; the launcher's
`keystore:=DIR` starts the router with zenohd.json5 and each node with its enclave's config, the
enclave being the node's fully qualified name (`/edge_llm/verifier_node`).
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import re
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

SESSION_CONFIG_ENV = "ZENOH_SESSION_CONFIG_URI"  # rmw_zenoh's names
ROUTER_CONFIG_ENV = "ZENOH_ROUTER_CONFIG_URI"
ROUTER_ENCLAVE = "zenohd"
DEFAULT_SECURE_ENDPOINT = "tls/127.0.0.1:7447"
CA_NAME = "sros2testCA"  # the CN `ros2 security create_keystore` gives its CA
VALID_DAYS = 3650

# What Zenoh's access control calls each message (zenoh 1.x `access_control.rules[].messages`).
LIVELINESS = ["liveliness_token", "liveliness_query", "declare_liveliness_subscriber", "reply"]
# By role: what a link in that role may send (the router's ingress, the session's egress) and receive.
ROLE_MESSAGES = {
    "publish": (["put", "delete", "declare_queryable", "reply", "liveliness_token", "liveliness_query",
                 "declare_liveliness_subscriber"],
                ["declare_subscriber", "query", "liveliness_token", "reply"]),
    "subscribe": (["declare_subscriber", "query", "liveliness_token", "liveliness_query",
                   "declare_liveliness_subscriber"],
                  ["put", "delete", "reply", "declare_queryable", "liveliness_token"]),
    "reply": (["declare_queryable", "reply"], ["query"]),
    "request": (["query"], ["declare_queryable", "reply"]),
}
ROLES = tuple(ROLE_MESSAGES)
ACTION_CALL = {"request": ("send_goal", "cancel_goal", "get_result"), "subscribe": ("feedback", "status")}
ACTION_EXECUTE = {"reply": ("send_goal", "cancel_goal", "get_result"), "publish": ("feedback", "status")}


class SecurityError(ValueError):
    """A policy, keystore or secured config that cannot be used; the message is one line and names the file."""


# ------------------------------------------------------------------ the policy
@dataclasses.dataclass
class Enclave:
    """One enclave of a policy: its path, its nodes, and the ROS names each role may use (resolved)."""

    path: str
    nodes: list[str] = dataclasses.field(default_factory=list)  # fully qualified node names
    allow: dict[str, set[str]] = dataclasses.field(default_factory=lambda: {r: set() for r in ROLES})
    deny: dict[str, set[str]] = dataclasses.field(default_factory=lambda: {r: set() for r in ROLES})

    @property
    def file_stem(self) -> str:
        return self.path.strip("/") or "root"


def _fqn(namespace: str, node: str) -> str:
    return "/" + "/".join(p for p in (namespace.strip("/"), node.strip("/")) if p)


def resolve_name(name: str, namespace: str, node: str) -> str:
    """A policy's topic/service name as an absolute ROS name: `~` is the node, relative is under its namespace."""
    name = name.strip()
    if name.startswith("~"):
        return _fqn(namespace, node) + name[1:]
    if name.startswith("/"):
        return name
    return _fqn(namespace, name)


def load_policy(path: str | Path) -> list[Enclave]:
    """Read an SROS2 policy file (`<policy><enclaves><enclave path=...><profiles><profile ns= node=>`)."""
    path = Path(path)
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError) as exc:
        raise SecurityError(f"policy {path}: {exc}") from None
    if root.tag != "policy" or root.find("enclaves") is None:
        raise SecurityError(f"policy {path}: expected <policy><enclaves>...</enclaves></policy>")
    enclaves = []
    for element in root.find("enclaves"):
        if element.tag != "enclave" or not element.get("path", "").startswith("/"):
            raise SecurityError(f"policy {path}: every <enclave> needs an absolute path=\"/...\"")
        enclave = Enclave(element.get("path"))
        for profile in element.iterfind("profiles/profile"):
            namespace, node = profile.get("ns", "/"), profile.get("node")
            if not node:
                raise SecurityError(f"policy {path}: a <profile> of enclave {enclave.path} has no node=\"...\"")
            enclave.nodes.append(_fqn(namespace, node))
            _read_profile(profile, enclave, namespace, node, path)
        enclaves.append(enclave)
    paths = [e.path for e in enclaves]
    if len(set(paths)) != len(paths) or f"/{ROUTER_ENCLAVE}" in paths:
        raise SecurityError(f"policy {path}: enclave paths must be unique and not /{ROUTER_ENCLAVE} (the router's)")
    return enclaves


def _read_profile(profile: ET.Element, enclave: Enclave, namespace: str, node: str, path: Path) -> None:
    groups = {"topics": ("topic", {"publish": "publish", "subscribe": "subscribe"}),
              "services": ("service", {"reply": "reply", "request": "request"}),
              "actions": ("action", {"execute": ACTION_EXECUTE, "call": ACTION_CALL})}
    for group in profile:
        if group.tag not in groups:
            raise SecurityError(f"policy {path}: unknown <{group.tag}> in the profile of {node}")
        item_tag, kinds = groups[group.tag]
        for kind, target in kinds.items():
            permission = group.get(kind)
            if permission is None:
                continue
            if permission not in ("ALLOW", "DENY"):
                raise SecurityError(f"policy {path}: {group.tag} {kind}=\"{permission}\": ALLOW or DENY")
            table = enclave.allow if permission == "ALLOW" else enclave.deny
            for item in group.iterfind(item_tag):
                name = resolve_name(item.text or "", namespace, node)
                if isinstance(target, str):
                    table[target].add(name)
                else:  # an action: its services and topics under `<name>/_action/`
                    for role, parts in target.items():
                        table[role].update(f"{name}/_action/{part}" for part in parts)


def write_policy(enclaves: list[Enclave], path: str | Path) -> None:
    """Write enclaves as an SROS2 policy file (one profile per node, absolute names)."""
    root = ET.Element("policy", version="0.2.0")
    xml_enclaves = ET.SubElement(root, "enclaves")
    tags = {"publish": ("topics", "topic"), "subscribe": ("topics", "topic"),
            "reply": ("services", "service"), "request": ("services", "service")}
    for enclave in enclaves:
        profiles = ET.SubElement(ET.SubElement(xml_enclaves, "enclave", path=enclave.path), "profiles")
        for fqn in enclave.nodes or [enclave.path]:
            namespace, _, node = fqn.rpartition("/")
            profile = ET.SubElement(profiles, "profile", ns=namespace or "/", node=node)
            for role in ROLES:
                if enclave.allow[role]:
                    group_tag, item_tag = tags[role]
                    group = ET.SubElement(profile, group_tag, {role: "ALLOW"})
                    for name in sorted(enclave.allow[role]):
                        ET.SubElement(group, item_tag).text = name
    ET.indent(root)
    Path(path).write_text(ET.tostring(root, encoding="unicode") + "\n")


def key_exprs(name: str, domain_id: int) -> list[str]:
    """The Zenoh keys of a ROS name: its data key `<domain>/<name>/<type>/<hash>` for any type and hash,
    `<domain>/<name>/*/*` (generate_configs writes `<domain>/<name>/**`, which also grants every name
    below this one; a subscription or queryable must be declared within the key a rule names), and
    zenoh-ext's publication-cache keys under it (`.../@adv/...`: Zenoh's `**` never matches a chunk
    that starts with `@`). A name ending in `*` keeps the prefix form: `/*` is every name; a `*`
    inside a part is Zenoh's `$*`."""
    parts = [p if p in ("*", "**") else p.replace("*", "$*") for p in name.strip("/").split("/")]
    if parts[-1] in ("*", "**"):
        while parts and parts[-1] in ("*", "**"):
            parts.pop()
        base = "/".join([str(domain_id), *parts, "*", "**"] if parts else [str(domain_id), "*", "**"])
        return [base, base + "/@adv/**"]
    base = "/".join([str(domain_id), *parts, "*", "*"])
    return [base, base + "/@adv/**"]


def _rules(enclave: Enclave, domain_id: int, prefix: str, session: bool = False) -> tuple[list[dict], list[str]]:
    """Zenoh access-control rules for one enclave, in the router's view (ingress: from the enclave) or,
    with ``session``, in the enclave's own session's (egress: what it sends)."""
    rules = []
    for permission, table in (("allow", enclave.allow), ("deny", enclave.deny)):
        for role in ROLES:
            names = sorted(table[role])
            if not names:
                continue
            keys = sorted({k for n in names for k in key_exprs(n, domain_id)})
            sends, receives = ROLE_MESSAGES[role]
            if permission == "deny":  # deny what the role would send; receiving stays governed by allows
                receives = []
            sent, received = ("egress", "ingress") if session else ("ingress", "egress")
            for flow, messages in ((sent, sends), (received, receives)):
                if messages:
                    rules.append({"id": f"{prefix}{permission}_{role}_{flow}", "messages": messages,
                                  "flows": [flow], "permission": permission, "key_exprs": keys})
    rules.append({"id": f"{prefix}liveliness", "messages": LIVELINESS, "flows": ["ingress", "egress"],
                  "permission": "allow", "key_exprs": [f"@ros2_lv/{domain_id}/**"]})
    return rules, [r["id"] for r in rules]


def _subject_id(enclave: Enclave) -> str:
    return re.sub(r"[^A-Za-z0-9_]", "_", enclave.file_stem)


def router_access_control(enclaves: list[Enclave], domain_id: int) -> dict:
    """The router's access control: each enclave's rules for the links whose certificate names it."""
    rules, subjects, policies = [], [], []
    for enclave in enclaves:
        sid = _subject_id(enclave)
        own, ids = _rules(enclave, domain_id, f"{sid}__")
        rules += own
        subjects.append({"id": sid, "cert_common_names": [enclave.path]})
        policies.append({"rules": ids, "subjects": [sid]})
    return {"enabled": True, "default_permission": "deny", "rules": rules, "subjects": subjects,
            "policies": policies}


def session_access_control(enclave: Enclave, domain_id: int) -> dict:
    """An enclave's own session rules (generate_configs' shape: subjects `router` and the node)."""
    rules, ids = _rules(enclave, domain_id, "", session=True)
    node = _subject_id(enclave)
    return {"enabled": True, "default_permission": "deny", "rules": rules,
            "subjects": [{"id": "router"}, {"id": node}],
            "policies": [{"rules": ids, "subjects": ["router", node]}]}


# ------------------------------------------------------------------ the keystore
@dataclasses.dataclass(frozen=True)
class Keystore:
    root: Path

    def __post_init__(self) -> None:
        object.__setattr__(self, "root", Path(self.root))

    @property
    def ca_cert(self) -> Path:
        return self.root / "public" / "ca.cert.pem"

    @property
    def ca_key(self) -> Path:
        return self.root / "private" / "ca.key.pem"

    @property
    def policy(self) -> Path:
        return self.root / "policy.xml"

    def enclave_dir(self, enclave: str) -> Path:
        return self.root / "enclaves" / enclave.strip("/")

    def session_config(self, enclave: str) -> Path:
        return self.root / "zenoh" / f"{enclave.strip('/')}.json5"

    @property
    def router_config(self) -> Path:
        return self.root / "zenoh" / f"{ROUTER_ENCLAVE}.json5"

    def enclaves(self) -> list[Enclave]:
        if not self.policy.is_file():
            raise SecurityError(f"keystore {self.root}: no {self.policy.name} (make one: edge-llm-ros security create)")
        return load_policy(self.policy)

    def enclave_of(self, node_fqn: str) -> str:
        """The enclave a node runs in: the enclave whose profile names it (its fully qualified name)."""
        for enclave in self.enclaves():
            if node_fqn in enclave.nodes or node_fqn == enclave.path:
                return enclave.path
        raise SecurityError(f"keystore {self.root}: no enclave for node {node_fqn} in {self.policy} "
                            f"(expected {self.session_config(node_fqn)})")


def _name(cn: str):
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _pem_key(key) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _write(path: Path, data: bytes, private: bool = False) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    if private:
        path.chmod(0o600)


def _certificate(subject: str, key, issuer_name, issuer_key, ca: bool, days: int, now: datetime.datetime):
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes

    builder = (x509.CertificateBuilder().subject_name(_name(subject)).issuer_name(issuer_name)
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=5))
               .not_valid_after(now + datetime.timedelta(days=days))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=1 if ca else None), critical=True))
    if ca:
        builder = builder.add_extension(x509.KeyUsage(
            digital_signature=True, content_commitment=False, key_encipherment=False, data_encipherment=False,
            key_agreement=False, key_cert_sign=True, crl_sign=True, encipher_only=False, decipher_only=False),
            critical=True)
    else:  # rustls (Zenoh's TLS) wants a subject alternative name on an end-entity certificate
        builder = builder.add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def create_keystore(root: str | Path, policy: str | Path, *, domain_id: int = 0,
                    endpoint: str = DEFAULT_SECURE_ENDPOINT, days: int = VALID_DAYS,
                    progress=None) -> Keystore:
    """A keystore for `policy`: the CA (made once, kept when the keystore exists), one identity per
    enclave and the router, and every Zenoh config. Returns it; raises SecurityError."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    store = Keystore(Path(root))
    enclaves = load_policy(policy)
    if not endpoint.startswith("tls/"):
        raise SecurityError(f"a secured router listens on tls/HOST:PORT, got '{endpoint}'")
    now = datetime.datetime.now(datetime.timezone.utc)
    if store.ca_cert.is_file() and store.ca_key.is_file():
        ca_cert = _read_cert(store.ca_cert)
        ca_key = serialization.load_pem_private_key(store.ca_key.read_bytes(), None)
    else:
        ca_key = ec.generate_private_key(ec.SECP256R1())
        ca_cert = _certificate(CA_NAME, ca_key, _name(CA_NAME), ca_key, True, days, now)
        _write(store.ca_cert, ca_cert.public_bytes(serialization.Encoding.PEM))
        _write(store.ca_key, _pem_key(ca_key), private=True)
    for alias in ("identity_ca", "permissions_ca"):  # SROS2's names for the same CA
        for folder, suffix, src in (("public", "cert", store.ca_cert), ("private", "key", store.ca_key)):
            link = store.root / folder / f"{alias}.{suffix}.pem"
            if not link.exists():
                link.symlink_to(src.name)
    ca_pem = ca_cert.public_bytes(serialization.Encoding.PEM)
    for path in [e.path for e in enclaves] + [f"/{ROUTER_ENCLAVE}"]:
        key = ec.generate_private_key(ec.SECP256R1())
        cert = _certificate(path, key, ca_cert.subject, ca_key, False, days, now)
        folder = store.enclave_dir(path)
        _write(folder / "cert.pem", cert.public_bytes(serialization.Encoding.PEM))
        _write(folder / "key.pem", _pem_key(key), private=True)
        _write(folder / "identity_ca.cert.pem", ca_pem)
        _write(folder / "permissions_ca.cert.pem", ca_pem)
        if progress:
            progress(path)
    store.policy.parent.mkdir(parents=True, exist_ok=True)
    if Path(policy).resolve() != store.policy.resolve():
        shutil.copyfile(policy, store.policy)
    for enclave in enclaves:
        _write(store.session_config(enclave.path),
               _dump(session_config_dict(store, enclave, domain_id, endpoint)).encode())
    _write(store.router_config, _dump(router_config_dict(store, enclaves, domain_id, endpoint)).encode())
    return store


def _tls(store: Keystore, enclave: str) -> dict:
    folder = store.enclave_dir(enclave).resolve()
    return {"enable_mtls": True, "verify_name_on_connect": False,
            "root_ca_certificate": str(folder / "identity_ca.cert.pem"),
            "listen_private_key": str(folder / "key.pem"), "listen_certificate": str(folder / "cert.pem"),
            "connect_private_key": str(folder / "key.pem"), "connect_certificate": str(folder / "cert.pem")}


def session_config_dict(store: Keystore, enclave: Enclave, domain_id: int, endpoint: str) -> dict:
    return {
        "mode": "client",  # every sample through the router and its rules; no peer links around it
        "connect": {"endpoints": [endpoint]},
        "listen": {"endpoints": []},
        "scouting": {"multicast": {"enabled": False}},
        "timestamping": {"enabled": {"router": True, "peer": True, "client": True}},
        "transport": {"link": {"protocols": ["tls"], "tls": _tls(store, enclave.path)}},
        "access_control": session_access_control(enclave, domain_id),
    }


def router_config_dict(store: Keystore, enclaves: list[Enclave], domain_id: int, endpoint: str) -> dict:
    return {
        "mode": "router",
        "listen": {"endpoints": [endpoint]},
        "scouting": {"multicast": {"enabled": False}},
        "timestamping": {"enabled": {"router": True, "peer": True, "client": True}},
        "transport": {"link": {"protocols": ["tls"], "tls": _tls(store, f"/{ROUTER_ENCLAVE}")}},
        "access_control": router_access_control(enclaves, domain_id),
    }


def _dump(config: dict) -> str:
    return json.dumps(config, indent=2) + "\n"


# ------------------------------------------------------------------ loading and checking
def _read_cert(path: Path):
    from cryptography import x509

    try:
        return x509.load_pem_x509_certificate(path.read_bytes())
    except PermissionError:
        raise SecurityError(f"keystore: {path}: unreadable (permission denied)") from None
    except OSError as exc:
        raise SecurityError(f"keystore: {path}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise SecurityError(f"keystore: {path}: not a PEM certificate ({exc})") from None


def _read_key(path: Path):
    from cryptography.hazmat.primitives import serialization

    try:
        return serialization.load_pem_private_key(path.read_bytes(), None)
    except PermissionError:
        raise SecurityError(f"keystore: {path}: unreadable (permission denied)") from None
    except OSError as exc:
        raise SecurityError(f"keystore: {path}: {exc.strerror or exc}") from None
    except (ValueError, TypeError) as exc:
        raise SecurityError(f"keystore: {path}: not an unencrypted PEM private key ({exc})") from None


def check_tls(tls: dict, now: datetime.datetime | None = None) -> str:
    """Check a `transport/link/tls` section's files as the handshake will use them; the certificate's CN.

    Raises SecurityError naming the file at fault: missing or unreadable, not PEM, expired or not yet
    valid, not signed by the root CA, or a key that is not the certificate's.
    """
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives import serialization
    from cryptography.x509.oid import NameOID

    now = now or datetime.datetime.now(datetime.timezone.utc)
    try:
        ca_file, cert_file, key_file = (Path(tls[k]) for k in
                                        ("root_ca_certificate", "connect_certificate", "connect_private_key"))
    except KeyError as exc:
        raise SecurityError(f"keystore: the tls section names no {exc.args[0]}") from None
    ca, cert, key = _read_cert(ca_file), _read_cert(cert_file), _read_key(key_file)
    for path, c in ((ca_file, ca), (cert_file, cert)):
        if c.not_valid_after_utc < now:
            raise SecurityError(f"keystore: {path}: certificate expired on {c.not_valid_after_utc:%Y-%m-%d %H:%M} UTC")
        if c.not_valid_before_utc > now:
            raise SecurityError(f"keystore: {path}: certificate not valid before "
                                f"{c.not_valid_before_utc:%Y-%m-%d %H:%M} UTC")
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        raise SecurityError(f"keystore: {cert_file}: not signed by the CA in {ca_file}") from None
    public = serialization.PublicFormat.SubjectPublicKeyInfo
    if (key.public_key().public_bytes(serialization.Encoding.PEM, public)
            != cert.public_key().public_bytes(serialization.Encoding.PEM, public)):
        raise SecurityError(f"keystore: {key_file}: this key is not the one of {cert_file}")
    names = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    return str(names[0].value) if names else ""


def read_config(path: str | Path) -> dict:
    """A Zenoh config file (JSON5 as generate_configs writes it: plain JSON) as a dict."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise SecurityError(f"zenoh config {path}: {exc.strerror or exc}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        pass
    try:
        import zenoh

        return json.loads(str(zenoh.Config.from_json5(text)))
    except Exception as exc:  # zenoh.ZError: not JSON5 either
        raise SecurityError(f"zenoh config {path}: not JSON5 ({' '.join(str(exc).split())[:200]})") from None


def _tls_section(config: dict) -> dict | None:
    return config.get("transport", {}).get("link", {}).get("tls")


def check_secured_config(path: str | Path) -> str:
    """A keystore's Zenoh config: it has a TLS section and its files pass :func:`check_tls`; the CN."""
    tls = _tls_section(read_config(path))
    if not tls:
        raise SecurityError(f"zenoh config {path}: no transport/link/tls section")
    return check_tls(tls)


def load_config(path: str | Path, *, listen: str | None = None, connect: str | None = None) -> Any:
    """A zenoh.Config from a config file, its TLS files checked first; endpoints replaced when given."""
    import zenoh

    config = read_config(path)
    tls = _tls_section(config)
    if tls:
        check_tls(tls)
    try:
        conf = zenoh.Config.from_json5(json.dumps(config))
        if listen is not None:
            conf.insert_json5("listen/endpoints", json.dumps([listen]))
        if connect is not None:
            conf.insert_json5("connect/endpoints", json.dumps([connect]))
    except Exception as exc:  # zenoh.ZError
        raise SecurityError(f"zenoh config {path}: {' '.join(str(exc).split())[:300]}") from None
    return conf


def config_endpoints(path: str | Path, key: str) -> list[str]:
    """`connect` or `listen` endpoints of a config file."""
    return list(read_config(path).get(key, {}).get("endpoints", []))


def session_config_uri() -> str | None:
    return os.environ.get(SESSION_CONFIG_ENV) or None


def use_enclave(keystore: str | Path, enclave: str) -> Path:
    """Point this process's sessions at `enclave`'s config in `keystore` (the CLI's --keystore/--enclave)."""
    store = Keystore(Path(keystore))
    path = store.session_config(enclave)
    if not path.is_file():
        known = sorted(e.path for e in store.enclaves()) if store.policy.is_file() else []
        raise SecurityError(f"keystore {store.root}: no enclave {enclave} (no {path})"
                            + (f"; enclaves: {', '.join(known)}" if known else ""))
    os.environ[SESSION_CONFIG_ENV] = str(path.resolve())
    return path
