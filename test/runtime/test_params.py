"""ROS 2 arguments, params files and names, as rcl handles them (no middleware involved)."""

from pathlib import Path

import pytest

from edge_llm_ros.runtime.params import (
    ParamsError,
    Remap,
    expand_name,
    format_param_value,
    list_nodes,
    load_params_file,
    parse_param_value,
    parse_ros_args,
    resolve_name,
)


def write(tmp_path: Path, text: str, name: str = "params.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


# ------------------------------------------------------------------ arguments
def test_ros_args_full_command_line():
    args = parse_ros_args([
        "prog", "--verbose", "--ros-args", "-r", "__node:=echo", "--remap", "__ns:=/edge_llm",
        "-r", "chatter:=/out", "-r", "talker:foo:=bar", "-p", "mode:=tree", "--param", "gamma:=4",
        "-p", "ratio:=0.5", "-p", "flag:=true", "-p", "ids:=[1, 2, 3]", "-p", "names:=[a, b]",
        "-p", "quoted:='7'", "-p", "day:=2024-01-01", "--params-file", "a.yaml", "--params-file", "b.yaml",
        "--log-level", "DEBUG", "--log-level", "rcl:=warn", "--disable-rosout-logs", "--", "tail",
    ])
    assert args.args == ["prog", "--verbose", "tail"]
    assert args.node_name == "echo" and args.namespace == "/edge_llm"
    assert [r for r in args.remaps if not r.src.startswith("__")] == [
        Remap("chatter", "/out"), Remap("foo", "bar", node="talker")]
    assert args.params == {"mode": "tree", "gamma": 4, "ratio": 0.5, "flag": True, "ids": [1, 2, 3],
                           "names": ["a", "b"], "quoted": "7", "day": "2024-01-01"}
    assert [type(v) for v in (args.params["gamma"], args.params["ratio"])] == [int, float]
    assert args.params_files == ["a.yaml", "b.yaml"]
    assert args.log_level == "debug" and args.log_levels == {"rcl": "warn"}
    assert args.options == {"disable-rosout-logs": True}


def test_ros_args_sections_and_defaults():
    plain = parse_ros_args(["run", "x"])
    assert plain.args == ["run", "x"] and plain.node_name is None and plain.namespace is None
    assert plain.node_identity("echo_node", "/edge_llm") == ("echo_node", "/edge_llm")
    # several --ros-args sections; an unterminated one runs to the end
    args = parse_ros_args(["--ros-args", "-p", "a:=1", "--", "mid", "--ros-args", "-p", "a:=2", "-p", "b:=x"])
    assert args.args == ["mid"] and args.params == {"a": 2, "b": "x"}


def test_node_identity_honours_node_prefixed_rules_first_match_wins():
    args = parse_ros_args(["--ros-args", "-r", "other:__node:=nope", "-r", "talker:__node:=chatty",
                           "-r", "__node:=generic", "-r", "__ns:=relative/ns", "-r", "__ns:=/ignored"])
    assert args.node_identity("talker") == ("chatty", "/relative/ns")
    assert args.node_identity("listener") == ("generic", "/relative/ns")
    assert args.node_name == "generic" and args.namespace == "/relative/ns"


@pytest.mark.parametrize("argv, message", [
    (["--ros-args", "--bogus"], "unknown ROS argument '--bogus'"),
    (["--ros-args", "-p"], "-p needs a value"),
    (["--ros-args", "-r", "--"], "-r needs a value"),
    (["--ros-args", "-p", "novalue"], "-p expects name:=value"),
    (["--ros-args", "-p", ":=3"], "-p expects name:=value"),
    (["--ros-args", "-p", "x:="], "parameter 'x' has no value"),
    (["--ros-args", "-p", "x:={a: 1}"], "unsupported value"),
    (["--ros-args", "-p", "x:=[1, a]"], "one type"),
    (["--ros-args", "-p", "x:=[1"], "cannot parse value"),
    (["--ros-args", "-r", "chatter"], "-r expects [node:]from:=to"),
    (["--ros-args", "-r", "__node:=bad-name"], "invalid node name"),
    (["--ros-args", "--log-level", "loud"], "unknown log level 'loud'"),
])
def test_ros_args_errors(argv, message):
    with pytest.raises(ParamsError) as err:
        parse_ros_args(argv)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_param_values_round_trip_through_their_text():
    for value in ["tree", "123", "", "true", "a: b", "2024-01-01", 1, 2.5, 0.0, False, [1, 2], [0.5], ["x", "y z"]]:
        parsed = parse_param_value(format_param_value(value))
        assert parsed == value and type(parsed) is type(value)


INT64_RANGE = "(int64 [-9223372036854775808, 9223372036854775807])"


def test_integer_params_are_int64():
    assert parse_param_value("9223372036854775807") == 2**63 - 1
    assert parse_param_value("[-9223372036854775808, 0]") == [-(2**63), 0]
    assert parse_param_value("1.0e+400") == float("inf")  # a double, as rcl reads it


@pytest.mark.parametrize("text, message", [
    ("99999999999999999999", f"parameter 'seed': 99999999999999999999 is out of range for an integer parameter {INT64_RANGE}"),
    ("-9223372036854775809", "parameter 'seed': -9223372036854775809 is out of range for an integer parameter"),
    ("[1, 9223372036854775808]", "parameter 'seed': 9223372036854775808 is out of range for an integer parameter"),
    ("9" * 5000, "parameter 'seed': cannot parse value '" + "9" * 60 + "...' (Exceeds the limit (4300 digits) for "
                 "integer string conversion: value has 5000 digits)"),
])
def test_param_values_past_int64_are_one_clear_error(text, message):
    with pytest.raises(ParamsError) as err:
        parse_ros_args(["--ros-args", "-p", f"seed:={text}"])
    assert str(err.value).startswith(message) and "\n" not in str(err.value), err.value


def test_params_file_values_past_int64_name_file_node_and_parameter(tmp_path):
    path = write(tmp_path, "talker:\n  ros__parameters:\n    seed: 18446744073709551616\n")
    with pytest.raises(ParamsError) as err:
        load_params_file(path, "/talker")
    assert str(err.value) == (f"{path}: parameter 'seed' of 'talker': 18446744073709551616 is out of range for an "
                              f"integer parameter {INT64_RANGE}")
    path = write(tmp_path, "talker:\n  ros__parameters:\n    seed: " + "9" * 5000 + "\n", "long.yaml")
    with pytest.raises(ParamsError, match=r"long.yaml: cannot read a value \(Exceeds the limit \(4300 digits\)"):
        load_params_file(path, "/talker")


# ---------------------------------------------------------------- params file
PIPELINE = """
/**:
  ros__parameters:
    use_sim_time: false
    mode: base
edge_llm:
  echo_node:
    ros__parameters:
      mode: echo
      sampling: {top_k: 5, limits: {max_tokens: 64}}
  /**/monitor:
    ros__parameters:
      stats_period_s: 2.0
/edge_llm/monitor:
  ros__parameters:
    stats_period_s: 1.0
/**/echo_node:
  ros__parameters:
    chunk_tokens: 4
/*:
  ros__parameters:
    root_only: true
echo_node:
  ros__parameters:
    bare_key: applies only to /echo_node
"""


def test_params_file_matching_rules(tmp_path):
    path = write(tmp_path, PIPELINE)
    echo = load_params_file(path, "/edge_llm/echo_node")
    assert echo == {"use_sim_time": False, "mode": "echo", "sampling.top_k": 5,
                    "sampling.limits.max_tokens": 64, "chunk_tokens": 4}
    # the nested '/**/monitor' entry means /edge_llm/**/monitor; the later FQN entry overrides it
    assert load_params_file(path, "/edge_llm/monitor") == {"use_sim_time": False, "mode": "base",
                                                           "stats_period_s": 1.0}
    assert load_params_file(path, "/edge_llm/deep/monitor")["stats_period_s"] == 2.0
    # '/*' is one token: root-namespace nodes only; a bare key is a root-namespace node too (rcl)
    assert load_params_file(path, "/echo_node") == {"use_sim_time": False, "mode": "base", "chunk_tokens": 4,
                                                    "root_only": True, "bare_key": "applies only to /echo_node"}
    assert load_params_file(path, "/other/planner") == {"use_sim_time": False, "mode": "base"}
    assert load_params_file(path, "edge_llm/echo_node") == echo  # a missing leading slash is tolerated
    assert list_nodes(path) == ["/edge_llm/echo_node", "/edge_llm/monitor", "/echo_node"]


def test_later_entries_and_later_files_override(tmp_path):
    first = write(tmp_path, "/ns/a:\n  ros__parameters: {x: 1, y: 1}\n/**:\n  ros__parameters: {x: 2}\n", "1.yaml")
    second = write(tmp_path, "ns:\n  a:\n    ros__parameters: {y: 3, z: [1.5, 2.5]}\n", "2.yaml")
    # within a file, matching entries apply in file order (rcl has no specificity ranking)
    assert load_params_file(first, "/ns/a") == {"x": 2, "y": 1}
    args = parse_ros_args(["--ros-args", "-p", "z:=[0.0]", "--params-file", str(first),
                           "--params-file", str(second)])
    # files in order, then -p over all of them
    assert args.parameters("/ns/a") == {"x": 2, "y": 3, "z": [0.0]}


@pytest.mark.parametrize("text, message", [
    ("echo_node:\n  ros__parameters:\n    mode: a: b\n", "malformed YAML (line 3, column 12: mapping values"),
    ("echo_node: {mode: echo\n", "malformed YAML (line 2"),
    ("echo_node:\n  mode: echo\n", "node entry 'echo_node/mode' has no ros__parameters"),
    ("edge_llm:\n  echo_node:\n", "node entry 'edge_llm/echo_node' has no ros__parameters"),
    ("echo_node:\n  ros__parameters:\n    mode: echo\n  chunk_tokens: 1\n", "keys beside ros__parameters"),
    ("ros__parameters:\n  mode: echo\n", "needs a node name"),
    ("- echo_node\n", "got a list"),
    ("echo_node:\n  ros__parameters:\n    mode:\n", "parameter 'mode' of 'echo_node' has no value"),
    ("echo_node:\n  ros__parameters:\n    ids: [1, two]\n", "one type"),
    ("echo_node:\n  ros__parameters: [1]\n", "must be a mapping"),
])
def test_params_file_errors_are_one_line_naming_the_file(tmp_path, text, message):
    path = write(tmp_path, text, "broken.yaml")
    with pytest.raises(ParamsError) as err:
        load_params_file(path, "/echo_node")
    assert str(err.value).startswith(f"{path}: ") and message in str(err.value)
    assert "\n" not in str(err.value)


def test_missing_and_empty_params_files(tmp_path):
    with pytest.raises(ParamsError, match=r"nope\.yaml: no such parameters file$"):
        load_params_file(tmp_path / "nope.yaml", "/a")
    with pytest.raises(ParamsError, match="nope.yaml: no such parameters file"):
        parse_ros_args(["--ros-args", "--params-file", str(tmp_path / "nope.yaml")]).parameters("/a")
    assert load_params_file(write(tmp_path, "# nothing yet\n"), "/a") == {}


# ---------------------------------------------------------------------- names
@pytest.mark.parametrize("name, expected", [
    ("chatter", "/edge_llm/chatter"),
    ("sub/topic", "/edge_llm/sub/topic"),
    ("/abs/topic", "/abs/topic"),
    ("~", "/edge_llm/echo"),
    ("~/stats", "/edge_llm/echo/stats"),
    ("{node}_out", "/edge_llm/echo_out"),
])
def test_expand_name(name, expected):
    assert resolve_name(name, "/edge_llm", "echo") == expected


def test_expand_name_in_root_namespace_and_errors():
    assert expand_name("chatter", "/", "talker") == "/chatter"
    assert expand_name("~/x", "", "talker") == "/talker/x"
    for bad in ["", "1abc", "a//b", "trailing/", "~x", "with-dash"]:
        with pytest.raises(ParamsError, match="invalid name"):
            expand_name(bad, "/ns", "node")


def test_remap_rules_match_expanded_names_first_wins():
    rules = parse_ros_args(["--ros-args", "-r", "__node:=echo", "-r", "chatter:=out", "-r", "/edge_llm/chatter:=/late",
                            "-r", "~/stats:=/diag", "-r", "talker:instruction:=/talker_only",
                            "-r", "echo:instruction:=/echo_only"]).remaps
    assert resolve_name("chatter", "/edge_llm", "echo", rules) == "/edge_llm/out"  # dst expands too
    assert resolve_name("/edge_llm/chatter", "/edge_llm", "echo", rules) == "/edge_llm/out"
    assert resolve_name("stats", "/edge_llm", "echo", rules) == "/edge_llm/stats"
    assert resolve_name("~/stats", "/edge_llm", "echo", rules) == "/diag"
    assert resolve_name("instruction", "/edge_llm", "echo", rules) == "/echo_only"
    assert resolve_name("instruction", "/edge_llm", "other", rules) == "/edge_llm/instruction"
    assert resolve_name("__node", "/edge_llm", "echo", rules) == "/edge_llm/__node"  # name rules are not topic rules
    assert resolve_name("chatter", "/edge_llm", "echo", {"chatter": "/from_dict"}) == "/from_dict"
