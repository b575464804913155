"""Secured links (issue 30): keystores from SROS2 policies, the secured router, access control.

The keystore's CA, enclaves and Zenoh configs come from `edge-llm-ros security create`; what is
checked against them is independent of the code under test where it can be: raw eclipse-zenoh
sessions (their own config, no project code) try to join the secured router, publish where the
policy forbids it, and listen; the `cryptography` package reads the certificates back.
"""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from support import REPO, Proc, python_module, wait_until

from edge_llm_ros.runtime import security

POLICIES = REPO / "config" / "security"
# rmw_zenoh's design document: the data key of /chatter (std_msgs/String) in domain 0
CHATTER_KEY = "0/chatter/std_msgs::msg::dds_::String_/RIHS01_df668c740482bbd48fb39d76a70dfd4bd59db1288021743503259e948f6b1a18"
TWIST = "geometry_msgs::msg::dds_::Twist_"


def cli(*args: str, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "edge_llm_ros.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO, env={**os.environ, **(env or {})})


@pytest.fixture(scope="module")
def keystore(tmp_path_factory) -> security.Keystore:
    """go2_sim's shipped policy as a keystore, for domain 0."""
    root = tmp_path_factory.mktemp("keystore") / "go2_sim"
    out = cli("security", "create", str(root), "--policy", str(POLICIES / "go2_sim.xml"), "--domain-id", "0")
    assert out.returncode == 0, out.stderr
    return security.Keystore(root)


# ------------------------------------------------------------------ policies and rules
def test_a_policys_names_become_rmw_zenohs_data_keys_and_nothing_beside_them():
    import zenoh

    keys = [zenoh.KeyExpr(k) for k in security.key_exprs("/chatter", 0)]
    heard = lambda key: any(k.intersects(zenoh.KeyExpr(key)) for k in keys)  # noqa: E731
    assert heard(CHATTER_KEY)
    assert heard(CHATTER_KEY + "/@adv/pub/1f2e/0/_/_")  # zenoh-ext's cache of a transient-local publisher
    assert not heard(CHATTER_KEY.replace("chatter", "chatter2"))
    assert not heard("0/chatter/sub/std_msgs::msg::dds_::String_/RIHS01_00")  # a name below it
    assert not heard(CHATTER_KEY.replace("0/", "1/", 1))  # another domain
    every = [zenoh.KeyExpr(k) for k in security.key_exprs("*", 0)]
    assert all(any(k.intersects(zenoh.KeyExpr(key)) for k in every) for key in (CHATTER_KEY, "0/a/b/c/T/RIHS01_1"))


def test_go2_sims_policy_gives_each_topic_to_its_one_publisher():
    enclaves = {e.path: e for e in security.load_policy(POLICIES / "go2_sim.xml")}
    publishers = lambda topic: {p for p, e in enclaves.items() if topic in e.allow["publish"]}  # noqa: E731
    assert publishers("/cmd_vel") == publishers("/api/sport/request") == {"/edge_llm/go2_bridge"}
    assert publishers("/edge_llm/nav_action") == {"/edge_llm/navigator"}
    assert publishers("/camera/image_raw") == publishers("/odom") == {"/sim"}
    assert enclaves["/operator"].allow["publish"] == {"/edge_llm/instruction", "/estop"}
    assert enclaves["/operator"].allow["subscribe"] == {"/*"}
    router = security.router_access_control(list(enclaves.values()), 0)
    assert router["default_permission"] == "deny"
    subjects = {s["id"]: s["cert_common_names"] for s in router["subjects"]}
    assert sorted(sum(subjects.values(), [])) == sorted(enclaves)  # each enclave by its certificate's name


@pytest.mark.parametrize("name, deployments", [("go2_sim", ["robot", "edge_cloud", "pipeline"]), ("pipeline", [None]),
                                               ("edge_cloud", [None]), ("stages", [None])])
def test_every_node_of_each_launch_has_an_enclave_in_its_shipped_policy(name, deployments):
    from edge_llm_ros.runtime.launcher.plan import apply_launch_args, load_plan

    enclaves = security.load_policy(POLICIES / f"{name}.xml")
    nodes = {n for e in enclaves for n in e.nodes}
    for deployment in deployments:
        plan = load_plan(name)
        apply_launch_args(plan, ["foxglove:=true", *([f"deployment:={deployment}"] if deployment else [])])
        missing = {n.fqn for n in plan.nodes} - nodes
        assert not missing, (name, deployment, missing)
    assert "/operator" in {e.path for e in enclaves}


# ------------------------------------------------------------------ the keystore
def test_the_keystore_has_sros2s_layout_and_certificates_the_ca_signed(keystore):
    from cryptography import x509

    ca = x509.load_pem_x509_certificate(keystore.ca_cert.read_bytes())
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    for enclave in [e.path for e in keystore.enclaves()] + ["/zenohd"]:
        folder = keystore.enclave_dir(enclave)
        assert {p.name for p in folder.iterdir()} >= {"cert.pem", "key.pem", "identity_ca.cert.pem",
                                                     "permissions_ca.cert.pem"}
        cert = x509.load_pem_x509_certificate((folder / "cert.pem").read_bytes())
        cert.verify_directly_issued_by(ca)
        assert cert.subject.rfc4514_string() == f"CN={enclave}"
        assert oct((folder / "key.pem").stat().st_mode & 0o777) == "0o600"
    config = json.loads(keystore.session_config("/operator").read_text())
    assert config["transport"]["link"]["tls"]["enable_mtls"] is True
    assert config["connect"]["endpoints"] == ["tls/127.0.0.1:7447"] and config["listen"]["endpoints"] == []
    router = json.loads(keystore.router_config.read_text())
    assert router["listen"]["endpoints"] == ["tls/127.0.0.1:7447"]
    assert router["access_control"]["enabled"] and router["access_control"]["default_permission"] == "deny"
    checked = cli("security", "check", str(keystore.root))
    assert checked.returncode == 0 and checked.stdout.count("ok ") == len(keystore.enclaves()) + 1, checked.stdout


def _bad_copy(keystore, tmp_path, spoil) -> tuple[Path, Path]:
    """A copy of the keystore with one file spoiled by ``spoil(copy) -> the file``."""
    import shutil

    copy = tmp_path / "spoiled"
    shutil.copytree(keystore.root, copy, symlinks=True)
    for config in (copy / "zenoh").rglob("*.json5"):  # the configs name their files by absolute path
        config.write_text(config.read_text().replace(str(keystore.root.resolve()), str(copy.resolve())))
    return copy, spoil(security.Keystore(copy))


def _expired(store):
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization

    ca_key = serialization.load_pem_private_key(store.ca_key.read_bytes(), None)
    ca = x509.load_pem_x509_certificate(store.ca_cert.read_bytes())
    path = store.enclave_dir("/sim") / "cert.pem"
    old = x509.load_pem_x509_certificate(path.read_bytes())
    key = serialization.load_pem_private_key((store.enclave_dir("/sim") / "key.pem").read_bytes(), None)
    past = datetime.datetime(2024, 1, 1, tzinfo=datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(old.subject).issuer_name(ca.subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(past)
            .not_valid_after(past + datetime.timedelta(days=30)).sign(ca_key, hashes.SHA256()))
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return path


def _foreign(store):
    """/sim's certificate and key from a keystore with another CA."""
    other = store.root.parent / "other"
    security.create_keystore(other, store.policy)
    for name in ("cert.pem", "key.pem"):
        (store.enclave_dir("/sim") / name).write_bytes((security.Keystore(other).enclave_dir("/sim") / name).read_bytes())
    return store.enclave_dir("/sim") / "cert.pem"


def _mismatched_key(store):
    path = store.enclave_dir("/sim") / "key.pem"
    path.write_bytes((store.enclave_dir("/operator") / "key.pem").read_bytes())
    return path


def _unreadable_key(store):
    path = store.enclave_dir("/sim") / "key.pem"
    path.write_text("-----BEGIN PRIVATE KEY-----\nnot base64 at all\n-----END PRIVATE KEY-----\n")
    return path


def _missing_enclave(store):
    import shutil

    shutil.rmtree(store.enclave_dir("/sim"))
    return store.enclave_dir("/sim")


@pytest.mark.parametrize("spoil, says", [(_expired, "certificate expired on 2024-01-31"),
                                         (_foreign, "not signed by the CA in"),
                                         (_mismatched_key, "this key is not the one of"),
                                         (_unreadable_key, "not an unencrypted PEM private key"),
                                         (_missing_enclave, "No such file or directory")])
def test_a_bad_keystore_fails_the_launch_at_start_with_one_line_naming_the_file(keystore, tmp_path, spoil, says):
    copy, spoiled = _bad_copy(keystore, tmp_path, spoil)
    out = cli("launch", "go2_sim", f"keystore:={copy}", "--router", "tcp/127.0.0.1:1", timeout=60)
    assert out.returncode == 2, out.stdout + out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0] and str(spoiled.resolve()) in lines[0], out.stderr
    assert "started" not in out.stdout


def test_a_node_without_an_enclave_in_the_keystore_fails_the_launch(tmp_path):
    root = tmp_path / "pipeline_only"
    security.create_keystore(root, POLICIES / "pipeline.xml")
    out = cli("launch", "go2_sim", f"keystore:={root}", "--router", "tcp/127.0.0.1:1", timeout=60)
    assert out.returncode == 2 and "no enclave for node /sim" in out.stderr and "policy.xml" in out.stderr, out.stderr


# ------------------------------------------------------------------ the secured router, through processes
def raw_session(endpoint: str, tls: dict | None):
    """A plain eclipse-zenoh client: no project code, only the files it is given."""
    import zenoh

    conf = zenoh.Config()
    conf.insert_json5("mode", '"client"')
    conf.insert_json5("connect/endpoints", json.dumps([endpoint]))
    conf.insert_json5("scouting/multicast/enabled", "false")
    conf.insert_json5("connect/timeout_ms", "3000")
    if tls is not None:
        conf.insert_json5("transport/link/tls", json.dumps(tls))
    return zenoh.open(conf)


def enclave_tls(store: security.Keystore, enclave: str) -> dict:
    return json.loads(store.session_config(enclave).read_text())["transport"]["link"]["tls"]


@pytest.fixture(scope="module")
def secured_router(keystore):
    from edge_llm_ros.runtime.router import free_endpoint, router_reachable

    endpoint = "tls/" + free_endpoint().partition("/")[2]
    proc = Proc(python_module("edge_llm_ros.runtime.router", "--listen", endpoint),
                env={security.ROUTER_CONFIG_ENV: str(keystore.router_config)})
    wait_until(lambda: router_reachable(endpoint), 20, f"the secured router at {endpoint}")
    proc.wait_for_line("zenoh router listening on", 20)
    yield endpoint
    proc.stop()


@pytest.mark.slow
def test_only_a_certificate_of_the_keystores_ca_opens_a_session(keystore, secured_router, tmp_path):
    import zenoh

    with pytest.raises(zenoh.ZError):  # TLS without a client certificate: mutual TLS refuses it
        raw_session(secured_router, {"root_ca_certificate": str(keystore.ca_cert), "verify_name_on_connect": False})
    with pytest.raises(zenoh.ZError):  # plain TCP at the TLS port
        raw_session("tcp/" + secured_router.partition("/")[2], None)
    other = security.create_keystore(tmp_path / "other", keystore.policy)
    foreign = enclave_tls(other, "/operator")
    foreign["root_ca_certificate"] = str(keystore.ca_cert)  # trusts our router, but its certificate is not ours
    with pytest.raises(zenoh.ZError):
        raw_session(secured_router, foreign)
    session = raw_session(secured_router, enclave_tls(keystore, "/operator"))
    try:
        assert list(session.info.routers_zid())
    finally:
        session.close()


@pytest.mark.slow
def test_the_router_denies_every_publication_the_policy_does_not_grant(keystore, secured_router):
    """/operator may not publish /cmd_vel: 10,000 Twists from it reach no subscriber, while the
    bridge's (which may) do, through the same router to the same subscriber (the simulator's enclave)."""
    key = f"0/cmd_vel/{TWIST}/RIHS01_9c45bf16fe0983d80e3cfe750d6835843d265a9a6c46bd2e609fcddde6fb8d2a"
    heard: list[bytes] = []
    lock = threading.Lock()

    def on_sample(sample) -> None:
        with lock:
            heard.append(sample.payload.to_bytes())

    sim = raw_session(secured_router, enclave_tls(keystore, "/sim"))
    operator = raw_session(secured_router, enclave_tls(keystore, "/operator"))
    bridge = raw_session(secured_router, enclave_tls(keystore, "/edge_llm/go2_bridge"))
    try:
        subscriber = sim.declare_subscriber(f"0/cmd_vel/{TWIST}/*", on_sample)
        bridge_pub = bridge.declare_publisher(key)
        wait_until(lambda: bridge_pub.put(b"bridge") or any(h == b"bridge" for h in list(heard)), 20,
                   "the bridge's Twist at the simulator")
        attacker = operator.declare_publisher(key)
        for i in range(10_000):
            attacker.put(b"forged %d" % i)
        bridge_pub.put(b"bridge, after")  # same router, after the forged ones: once it is here, they were routed
        wait_until(lambda: b"bridge, after" in list(heard), 20, "the bridge's last Twist")
        assert not [h for h in heard if h.startswith(b"forged")]
        subscriber.undeclare()
    finally:
        for session in (sim, operator, bridge):
            session.close()


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_secured_go2_sim_reaches_the_red_chair_and_no_forbidden_twist_moves_it(tmp_path):
    """`edge-llm-ros launch go2_sim keystore:=K`: the router on tls/ only, each node in its enclave. The
    operator's enclave, which may not publish /cmd_vel, sends Twists there (a raw Zenoh session with the
    operator's certificate, no project code, so no session rules of ours hold it back): the Go2 stays
    where it is. The operator's `edge-llm-ros topic pub --keystore K --enclave /operator` instruction
    then drives it to the red chair."""

    from edge_llm_ros.nav.world import REACH_M, Pose, body_gap
    from edge_llm_ros.nav.worldgen import GenerateConfig, generate
    from edge_llm_ros.runtime import graph
    from edge_llm_ros.runtime.interfaces import registry
    from edge_llm_ros.runtime.router import free_endpoint

    domain = int(os.environ.get("ROS_DOMAIN_ID", "0"))
    store = security.create_keystore(tmp_path / "keystore", POLICIES / "go2_sim.xml", domain_id=domain)
    endpoint = "tls/" + free_endpoint().partition("/")[2]
    seed = 100  # test_go2_sim's evaluation world
    launch = Proc(python_module("edge_llm_ros.runtime.cli", "launch", "go2_sim", f"keystore:={store.root}",
                                "--router", endpoint, "world:=seeded", f"seed:={seed}", "max_actions:=40"))
    odoms, episodes = [], []
    cond = threading.Condition()

    def keep(into, ros_type):
        def on_sample(sample) -> None:
            with cond:
                into.append(registry().deserialize(sample.payload.to_bytes(), ros_type))
                cond.notify_all()
        return on_sample

    def wait_for(what, predicate, timeout):
        with cond:
            assert cond.wait_for(predicate, timeout), f"no {what} within {timeout:g} s\n{launch.output[-3000:]}"

    operator = None
    try:
        launch.wait_for_line("active: navigating with SmolLM2", 240)
        operator = raw_session(endpoint, enclave_tls(store, "/operator"))
        operator.declare_subscriber(f"{domain}/odom/*/*", keep(odoms, "nav_msgs/msg/Odometry"))
        operator.declare_subscriber(f"{domain}/edge_llm/navigator/episode/*/*", keep(episodes, "std_msgs/msg/String"))
        wait_for("odometry", lambda: len(odoms) >= 2, 60)
        start = odoms[-1].pose.pose.position
        twist_type = "geometry_msgs/msg/Twist"
        key = graph.data_key(domain, "/cmd_vel", twist_type, registry().type_hash(twist_type))
        forward = registry().serialize(registry().from_dict(twist_type, {"linear": {"x": 1.0}, "angular": {"z": 1.0}}),
                                       twist_type)
        attachment = graph.Attachment(0, time.time_ns(), os.urandom(16)).to_bytes()
        forged = operator.declare_publisher(key)
        for _ in range(500):
            forged.put(forward, attachment=attachment)
        seen = len(odoms)
        wait_for("20 odometry messages after the forged Twists", lambda: len(odoms) >= seen + 20, 60)
        for odom in odoms[seen:]:
            assert odom.twist.twist.linear.x == 0.0 and odom.twist.twist.angular.z == 0.0
            assert (odom.pose.pose.position.x, odom.pose.pose.position.y) == (start.x, start.y)
        sent = cli("topic", "pub", "--once", "--keystore", str(store.root), "--enclave", "/operator",
                   "/edge_llm/instruction", "std_msgs/msg/String", "{data: 'go to the red chair'}",
                   env={"EDGE_LLM_ZENOH_ROUTER": endpoint})
        assert sent.returncode == 0, sent.stderr
        wait_for("the episode's summary", lambda: any(json.loads(e.data).get("outcome") for e in episodes), 300)
        summary = next(json.loads(e.data) for e in episodes if json.loads(e.data).get("outcome"))
        assert summary["outcome"] == "stopped", (summary, launch.output[-3000:])
        at_rest = [o for o in odoms if o.twist.twist.linear.x == 0.0 and o.twist.twist.angular.z == 0.0]
        wait_for("odometry at rest after the stop", lambda: odoms[-1].twist.twist.linear.x == 0.0, 30)
        final = odoms[-1].pose.pose.position
        gap = body_gap(Pose(final.x, final.y, 0.0), generate(seed, GenerateConfig(clear_path=True)).target_object)
        assert gap <= REACH_M + 0.15 and at_rest, (gap, summary)  # test_go2_sim's STOP_BAND_M
        assert "collision: touched" not in launch.output
    finally:
        if operator is not None:
            operator.close()
        launch.popen.send_signal(2)
        try:
            launch.wait(60)
        finally:
            launch.stop()


def result_token_ids(output: str) -> list[int]:
    """The token ids of `action send_goal`'s printed Result."""
    lines = output.split("Result:", 1)[1].splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == "token_ids:")
    ids = []
    for line in lines[start + 1:]:
        if not line.strip().startswith("- "):
            break
        ids.append(int(line.strip()[2:]))
    return ids


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("name, reference, extra", [("pipeline", "llama.cpp", []),
                                                    ("edge_cloud", "torch", ["draft_backend:=torch"])])
def test_a_secured_deployment_answers_the_operator_with_the_target_greedy_tokens(tmp_path, references, name,
                                                                                 reference, extra):
    """`edge-llm-ros launch NAME keystore:=K`, and a Generate goal from the operator's enclave through the
    CLI (--keystore --enclave): the tokens of the target's greedy decoding by llama.cpp or transformers
    themselves, computed here."""
    from edge_llm_ros.runtime.router import free_endpoint

    prompt, tokens = "Name a fruit.", 16
    domain = int(os.environ.get("ROS_DOMAIN_ID", "0"))
    store = security.create_keystore(tmp_path / "keystore", POLICIES / f"{name}.xml", domain_id=domain)
    endpoint = "tls/" + free_endpoint().partition("/")[2]
    launch = Proc(python_module("edge_llm_ros.runtime.cli", "launch", name, f"keystore:={store.root}",
                                "--router", endpoint, *extra))
    try:
        expected = references.Greedy(reference).tokens(prompt, tokens)
        launch.wait_for_line("active: ", 240)
        sent = cli("action", "send_goal", "--keystore", str(store.root), "--enclave", "/operator", "--timeout", "240",
                   "/edge_llm/generate", "edge_llm_ros/action/Generate",
                   f"{{prompt: '{prompt}', max_new_tokens: {tokens}}}", env={"EDGE_LLM_ZENOH_ROUTER": endpoint},
                   timeout=300)
        assert sent.returncode == 0 and "SUCCEEDED" in sent.stdout, (sent.stdout[-2000:], sent.stderr[-2000:],
                                                                     launch.output[-3000:])
        assert result_token_ids(sent.stdout) == expected
    finally:
        launch.popen.send_signal(2)
        try:
            launch.wait(60)
        finally:
            launch.stop()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_under_ros2_a_keystore_on_this_fast_dds_stops_the_nodes_instead_of_running_them_unsecured(request,
                                                                                                  tmp_path):
    """`ros2 launch edge_llm_ros edge_cloud.launch.py keystore:=K` sets SROS2's environment (Enforce) and
    each node's enclave; ../shared/ros2's Fast DDS has no security plugins (docs/ros2.md), so rmw_fastrtps
    refuses every node, the launch's own lifecycle manager first: `ros2 launch` ends and no node comes up
    under rclpy without security."""
    from hosts import host_for, start_launch, stop_launch

    request.getfixturevalue("ros2_env")
    host = host_for(request, "rclpy")
    store = security.create_keystore(tmp_path / "keystore", POLICIES / "edge_cloud.xml")
    launch = start_launch(host, "", "edge_cloud", f"keystore:={store.root}")
    try:
        launch.wait_for_line("This Fast DDS version doesn't have the security libraries", 120)
        launch.wait(120)
    finally:
        stop_launch(launch)
    assert "runtime: rclpy" not in launch.output  # no node got as far as its first log line


@pytest.mark.slow
@pytest.mark.serial  # four deployments at once: beside the other worker's tests it took 52 s (33 s alone)
@pytest.mark.timeout(600)
def test_the_security_bench_runs_plain_and_secured_deployments_side_by_side(tmp_path):
    """`bench --scenario security --quick`: both parts, both arms, the secured answers identical to the
    plain ones. Whether mTLS stays within its 5% is the bench's to measure (a miss makes its exit status 1),
    not this test's: one short round is noise, so a miss of those targets alone is accepted here."""
    from edge_llm_ros.tools.bench_security import failures

    path = tmp_path / "security.json"
    proc = subprocess.run([sys.executable, "-m", "edge_llm_ros.tools.bench", "--scenario", "security", "--quick",
                           "--json", str(path), "--no-progress"], cwd=REPO, capture_output=True, text=True,
                          timeout=540)
    report = json.loads(path.read_text())
    assert proc.returncode == 0 or (proc.returncode == 1 and failures(report)), proc.stdout + proc.stderr
    assert report["scenario"] == "security" and report["identical"] is True and report["rounds"] == 1
    for part, key in (("edge_cloud", "round_ms"), ("serving", "tokens_per_s")):
        assert set(report[part][key]) == {"plain", "secured"} and all(v > 0 for v in report[part][key].values())
        assert report[part]["ratio"] > 0
    assert "edge-cloud round time" in proc.stdout and "serving (4 clients)" in proc.stdout
