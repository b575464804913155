"""The bench harness (tools/bench_harness.py): the registry, and the one main every scenario goes
through (JSON, PNG, failures, exit status), on a tiny scenario registered here."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from dataclasses import replace

import pytest
from support import REPO

from edge_llm_ros.tools import bench, bench_harness
from edge_llm_ros.tools.bench_harness import SCENARIOS, Scenario, register, scenario_parser
from edge_llm_ros.tools.loading import ToolError

SHIPPED = {"engine", "edge-cloud", "reliability", "security", "serving", "pipeline", "nav"}  # the names users type


def run_main(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = bench.main(argv, out=out, err=err)
    return code, out.getvalue(), err.getvalue()


# -- the registry ---------------------------------------------------------------------------------


def test_every_scenario_is_registered_by_the_verb():
    assert set(SCENARIOS) == SHIPPED
    assert bench_harness.names()[0] == bench_harness.DEFAULT == "engine"
    for name, scenario in SCENARIOS.items():
        assert scenario.name == name and scenario.help and "\n" not in scenario.help


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_each_scenarios_parser_has_the_options_the_harness_reads(name):
    scenario = SCENARIOS[name]
    args = vars(scenario.build_parser().parse_args(["--scenario", name]))
    assert args["scenario"] == name and args["json"] is None
    assert args["quick"] is False and args["no_progress"] is False
    assert ("png" in args) == (scenario.plot is not None), name
    if scenario.writes_log:
        assert "log" in args, name


def test_help_lists_every_scenario_with_its_line(capsys):
    code, _, _ = run_main(["--help"])
    shown = capsys.readouterr().out
    assert code == 0 and shown.startswith("usage: edge-llm-ros bench ")
    listed = shown.split("scenarios (", 1)[1].splitlines()[1:]
    assert [line.split()[0] for line in listed] == bench_harness.names()
    for line in listed:
        name = line.split()[0]
        assert SCENARIOS[name].help in line, line
    assert "(default)" in listed[0] and "--modes" in shown  # the default scenario's own options


@pytest.mark.parametrize("name", sorted(SHIPPED - {"engine"}))
def test_a_scenarios_help_is_its_own(name, capsys):
    code, _, _ = run_main(["--scenario", name, "--help"])
    assert code == 0 and capsys.readouterr().out.startswith(f"usage: edge-llm-ros bench --scenario {name} ")


@pytest.mark.parametrize("argv, message", [
    (["--scenario", "warp"], "--scenario: unknown scenario 'warp'; expected one of engine, edge-cloud, nav, "),
    (["--scenario"], "argument --scenario: expected one argument"),
])
def test_an_unknown_scenario_is_one_usage_line(argv, message):
    code, out, err = run_main(argv)
    assert code == 2 and out == ""
    assert len(err.splitlines()) == 1 and err.startswith("error: ") and message in err, err


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_the_cli_verb_lists_the_registry_in_a_real_process():
    done = subprocess.run([sys.executable, "-m", "edge_llm_ros.cli", "bench", "--scenario", "no-such", "--quick"],
                          capture_output=True, text=True, timeout=120, cwd=REPO)
    assert done.returncode == 2 and done.stdout == "", done.stderr
    [line] = done.stderr.splitlines()
    assert line.startswith("error: --scenario: unknown scenario 'no-such'")
    assert all(name in line for name in SHIPPED)


def test_a_name_is_registered_once():
    with pytest.raises(ValueError, match="'nav' is registered already"):
        register(SCENARIOS["nav"])


# -- the one main, on a fake scenario ---------------------------------------------------------------


class Fake:
    """A scenario whose report is what its flags say; it records how the harness called it."""

    def __init__(self) -> None:
        self.calls: list[dict] = []
        self.plots: list = []

    def build_parser(self):
        p = scenario_parser("fake", "A scenario of the test.", quick="a quick fake", png="the fake plot", log=True)
        p.add_argument("--rows", type=int, default=2)
        p.add_argument("--mismatch", action="store_true", help="a failure line")
        p.add_argument("--lossy", action="store_true", help="the verdict false, no failure line")
        p.add_argument("--raise", dest="error", default=None, help="run raises ToolError(this)")
        p.add_argument("--interrupt", action="store_true")
        p.add_argument("--busy", type=float, default=None)
        return p

    def run(self, args, progress: bool) -> dict:
        self.calls.append({"json": args.json, "png": args.png, "log": args.log, "progress": progress,
                           "quick": args.quick})
        if args.error:
            raise ToolError(args.error)
        if args.interrupt:
            raise KeyboardInterrupt
        return {"scenario": "fake", "rows": list(range(args.rows)), "lossless": not (args.lossy or args.mismatch),
                "mismatch": args.mismatch, "other_cores": args.busy, "notes": ["a note"]}

    def format_table(self, report: dict) -> str:
        return f"fake table: {len(report['rows'])} rows"

    def failures(self, report: dict) -> list[str]:
        return ["LOSSLESS FAILURE: row 1 differs"] if report["mismatch"] else []

    def plot(self, report: dict, path) -> None:
        self.plots.append(path)
        path.write_bytes(b"PNG of the fake")


@pytest.fixture
def fake():
    made = Fake()
    register(Scenario(name="fake", help="a scenario of the test", build_parser=made.build_parser, run=made.run,
                      format_table=made.format_table, failures=made.failures, plot=made.plot, sends_goals=False,
                      writes_log=True, busy_cores=lambda report: report["other_cores"]))
    yield made
    SCENARIOS.pop("fake")


def test_a_run_prints_the_table_and_writes_the_json_and_the_png_next_to_it(fake, tmp_path):
    path = tmp_path / "fake.json"
    code, out, err = run_main(["--scenario", "fake", "--rows", "3", "--json", str(path)])
    assert code == 0, err
    assert out == "fake table: 3 rows\n"
    assert json.loads(path.read_text()) == {"scenario": "fake", "rows": [0, 1, 2], "lossless": True, "mismatch": False,
                                            "other_cores": None, "notes": ["a note"]}
    assert (tmp_path / "fake.png").read_bytes() == b"PNG of the fake"
    assert err.splitlines() == [f"wrote {path}", f"wrote {tmp_path / 'fake.png'}"]
    [call] = fake.calls
    assert call == {"json": path, "png": tmp_path / "fake.png", "log": tmp_path / "fake.log", "progress": False,
                    "quick": False}


def test_given_png_and_log_paths_are_kept_and_nothing_is_written_without_them(fake, tmp_path):
    png, log = tmp_path / "a" / "p.png", tmp_path / "l.txt"
    png.parent.mkdir()
    code, _, err = run_main(["--scenario", "fake", "--png", str(png), "--log", str(log), "--quick"])
    assert code == 0 and err == f"wrote {png}\n"
    assert fake.calls[0] == {"json": None, "png": png, "log": log, "progress": False, "quick": True}
    code, _, err = run_main(["--scenario", "fake"])
    assert code == 0 and err == "" and fake.calls[1]["png"] is None and len(fake.plots) == 1


@pytest.mark.parametrize("flag", ["--json", "--png", "--log"])
def test_a_missing_folder_is_refused_before_the_run(fake, flag):
    code, out, err = run_main(["--scenario", "fake", flag, "/no/such/folder/x.out"])
    assert code == 2 and out == "" and fake.calls == []
    assert err == f"error: {flag}: folder /no/such/folder does not exist\n"


def test_a_failure_line_or_a_false_verdict_is_exit_1_with_the_json_written(fake, tmp_path):
    path = tmp_path / "f.json"
    code, out, err = run_main(["--scenario", "fake", "--mismatch", "--json", str(path)])
    assert code == 1 and out == "fake table: 2 rows\n"
    assert err.splitlines()[-1] == "LOSSLESS FAILURE: row 1 differs"
    assert json.loads(path.read_text())["lossless"] is False
    code, _, err = run_main(["--scenario", "fake", "--lossy"])
    assert code == 1 and err == ""


def test_without_a_verdict_only_failure_lines_fail(fake):
    SCENARIOS["fake"] = replace(SCENARIOS["fake"], verdict=None)
    assert run_main(["--scenario", "fake", "--lossy"])[0] == 0
    assert run_main(["--scenario", "fake", "--mismatch"])[0] == 1


@pytest.mark.parametrize("argv, code, err", [
    (["--raise", "bad   input\there"], 2, "error: bad input here\n"),
    (["--raise", "the deployment stopped; its last lines:\nnode: boom"],
     2, "error: the deployment stopped; its last lines:\nnode: boom\n"),
    (["--interrupt"], 130, "interrupted\n"),
    (["--rows", "x"], 2, "error: argument --rows: invalid int value: 'x'\n"),
    (["--bogus"], 2, "error: unrecognized arguments: --bogus\n"),
])
def test_errors_and_interrupts(fake, argv, code, err):
    assert run_main(["--scenario", "fake", *argv]) == (code, "", err)


def test_a_busy_machine_is_warned_about_in_stderr_and_the_notes(fake, tmp_path):
    path = tmp_path / "b.json"
    code, _, err = run_main(["--scenario", "fake", "--busy", "1.5", "--json", str(path)])
    assert code == 0
    warning = err.splitlines()[0]
    assert warning.startswith("warning: other processes kept 1.5 of ") and "timings are unreliable" in warning
    assert json.loads(path.read_text())["notes"] == ["a note", warning.removeprefix("warning: ")]
    code, _, err = run_main(["--scenario", "fake", "--busy", str(bench_harness.BUSY_CORES / 2)])
    assert code == 0 and err == ""


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_bars_only_on_a_terminal_and_not_with_no_progress(fake, monkeypatch):
    monkeypatch.setattr(sys, "stderr", Terminal())
    run_main(["--scenario", "fake"])
    run_main(["--scenario", "fake", "--no-progress"])
    assert [call["progress"] for call in fake.calls] == [True, False]


def test_without_matplotlib_the_plot_is_a_warning(fake, tmp_path):
    def no_matplotlib(report, path):
        raise ImportError("No module named 'matplotlib'")

    SCENARIOS["fake"] = replace(SCENARIOS["fake"], plot=no_matplotlib)
    code, out, err = run_main(["--scenario", "fake", "--png", str(tmp_path / "p.png")])
    assert code == 0 and out == "fake table: 2 rows\n"
    assert err == "warning: no plot: matplotlib is not installed (pip install 'edge_llm_ros[bench]')\n"


def test_a_scenario_that_sends_goals_stops_at_once_without_this_packages_interfaces(fake, monkeypatch):
    from edge_llm_ros import runtime

    def missing(name):
        raise runtime.InterfaceError(f"unknown action type {name!r}: source the install")

    SCENARIOS["fake"] = replace(SCENARIOS["fake"], sends_goals=True)
    assert run_main(["--scenario", "fake"])[0] == 0  # found: this checkout's interfaces
    monkeypatch.setattr(runtime, "action", missing)
    code, out, err = run_main(["--scenario", "fake"])
    assert (code, out) == (2, "") and len(fake.calls) == 1
    assert err == "error: unknown action type 'edge_llm_ros/action/Generate': source the install\n"
