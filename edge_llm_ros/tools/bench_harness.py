"""The bench harness: every ``edge-llm-ros bench --scenario NAME`` runs through :func:`main`.

A scenario is a :class:`Scenario` record that its module registers (:func:`register`): its
command line (``build_parser``, made with :func:`scenario_parser`, which adds the options every
scenario shares), what it runs (``run(args, progress)``: the report, a dict that is its JSON), and
how the report reads (``format_table``, ``plot``, ``failures``, the ``verdict`` key). The harness
does the rest, the same way for every scenario:

1. picks the scenario (``--scenario``, default :data:`DEFAULT`; an unknown name is a usage error);
2. parses its command line; turns --json, --png and --log into paths (--png and --log default to
   the JSON's name with .png and .log) and refuses a folder that does not exist, before anything
   runs;
3. for a scenario that sends Generate goals from this process, checks that this package's
   interfaces are found (under ROS 2 without its install, one line says what to source);
4. runs it, with progress bars on stderr when stderr is a terminal (and not --no-progress);
5. warns when other processes kept the cores busy meanwhile (how busy: the scenario's
   ``busy_cores``), the warning added to the report's notes too;
6. prints the table on stdout, writes the report as JSON and the plot as PNG (what was written
   said on stderr);
7. prints each of the report's failures on stderr.

Exit status: 0 ok; 1 a lossless, exactness or target failure (a failure line, or the report's
verdict false); 2 bad usage (one ``error:`` line; a deployment that fails to start adds the nodes'
last lines); 130 interrupted.

Beside the harness, what the scenarios' reports share: :func:`fmt_value` and LOSSLESS_MARK for
tables, :class:`CpuShare` and :func:`busy_warning` for a busy machine, :func:`machine_info`,
:func:`version_of`, :func:`utc_now`, :func:`progress_bar`. The harness imports no scenario:
``tools/bench.py``, the verb, imports every scenario module, which registers them.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from edge_llm_ros.tools.generate import Parser, one_line
from edge_llm_ros.tools.loading import ToolError

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130
DEFAULT = "engine"  # what `edge-llm-ros bench` runs without --scenario
BUSY_CORES = 0.25  # other processes using this much CPU during a run make its timings unreliable
LOSSLESS_MARK = {True: "yes", False: "NO", None: "-"}  # a report's lossless flag, as a table shows it


# -- the registry ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Scenario:
    """One bench: what ``--scenario NAME`` runs, and how its report reads."""

    name: str
    help: str  # one line, for the list of scenarios in --help
    build_parser: Callable[[], argparse.ArgumentParser]  # scenario_parser(...) and the scenario's own options
    run: Callable[[argparse.Namespace, bool], dict]  # (args, progress) -> the report; ToolError for bad input
    format_table: Callable[[dict], str]
    failures: Callable[[dict], list[str]]  # one line per failure (empty: none)
    plot: Callable[[dict, Path], None] | None = None  # with --png
    verdict: str | None = "lossless"  # the report's key that must be true for exit 0 (None: failures only)
    sends_goals: bool = False  # sends Generate goals from this process: needs this package's interfaces
    writes_log: bool = False  # with --log: the launched nodes' output
    busy_cores: Callable[[dict], float | None] | None = None  # CPU other processes used while it measured


SCENARIOS: dict[str, Scenario] = {}


def register(scenario: Scenario) -> Scenario:
    """Add ``scenario`` to :data:`SCENARIOS` (its module does, once, when imported)."""
    if scenario.name in SCENARIOS:
        raise ValueError(f"a bench scenario named {scenario.name!r} is registered already")
    SCENARIOS[scenario.name] = scenario
    return scenario


def names() -> list[str]:
    """The registered scenarios' names, the default first."""
    return sorted(SCENARIOS, key=lambda name: (name != DEFAULT, name))


def scenario_list() -> str:
    """Every registered scenario with its one-line help, as --help ends."""
    width = max((len(name) for name in SCENARIOS), default=0)
    lines = [f"  {name:<{width}}  {SCENARIOS[name].help}" + (" (default)" if name == DEFAULT else "")
             for name in names()]
    return "\n".join(["scenarios (edge-llm-ros bench --scenario NAME --help: its options):", *lines])


def scenario_parser(name: str, description: str, *, quick: str, png: str | None = None,
                    log: bool = False) -> Parser:
    """A scenario's parser with the options the harness reads: --scenario, --quick (``quick`` says
    what it does), --json, --png (when the scenario plots: ``png`` says what), --log (when it
    launches nodes) and --no-progress. The list of scenarios ends its --help."""
    prog = "edge-llm-ros bench" + ("" if name == DEFAULT else f" --scenario {name}")
    p = Parser(prog=prog, description=description, epilog=scenario_list(),
               formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scenario", choices=names(), default=name, metavar="NAME",
                   help=f"the bench to run (default {DEFAULT}): one of the scenarios listed below")
    p.add_argument("--quick", action="store_true", help=quick)
    p.add_argument("--json", default=None, metavar="FILE", help="write the report as JSON")
    if png is not None:
        p.add_argument("--png", default=None, metavar="FILE",
                       help=f"{png} (default: next to --json, .png; needs matplotlib)")
    if log:
        p.add_argument("--log", default=None, metavar="FILE", help="the nodes' output (default: next to --json, .log)")
    p.add_argument("--no-progress", action="store_true",
                   help="no progress bar on stderr (there is one only when stderr is a terminal)")
    return p


# -- the one main ---------------------------------------------------------------------------------


def chosen(argv: list[str]) -> Scenario:
    """The scenario ``--scenario`` names in ``argv`` (:data:`DEFAULT` without one)."""
    pre = Parser(add_help=False)
    pre.add_argument("--scenario", default=DEFAULT)
    wanted = pre.parse_known_args(argv)[0].scenario
    if wanted not in SCENARIOS:
        raise ToolError(f"--scenario: unknown scenario {wanted!r}; expected one of {', '.join(names())}")
    return SCENARIOS[wanted]


def output_paths(scenario: Scenario, args: argparse.Namespace) -> None:
    """--json, and --png and --log where the scenario has them, as Paths on ``args`` (--png and --log
    next to --json unless given); ToolError for a folder that does not exist."""
    args.json = Path(args.json) if args.json else None
    outputs = {"--json": args.json}
    if scenario.plot is not None:
        args.png = outputs["--png"] = next_to(args.json, args.png, ".png")
    if scenario.writes_log:
        args.log = outputs["--log"] = next_to(args.json, args.log, ".log")
    for flag, path in outputs.items():
        if path is not None and not path.resolve().parent.is_dir():
            raise ToolError(f"{flag}: folder {path.parent} does not exist")


def next_to(json_path: Path | None, given: str | None, suffix: str) -> Path | None:
    """``given`` as a Path; else the JSON's path with ``suffix`` (None without --json)."""
    if given:
        return Path(given)
    return json_path.with_suffix(suffix) if json_path is not None else None


def check_interfaces() -> None:
    """This package's Generate action is found (under ROS 2: its colcon install is sourced)."""
    from edge_llm_ros.runtime import InterfaceError, action

    try:
        action("edge_llm_ros/action/Generate")
    except InterfaceError as exc:
        raise ToolError(one_line(exc)) from None


def main(argv: list[str] | None = None, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """``edge-llm-ros bench``: the chosen scenario parsed, run and reported; the exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    out = sys.stdout if out is None else out
    err = sys.stderr if err is None else err
    try:
        scenario = chosen(argv)
        args = scenario.build_parser().parse_args(argv)
        output_paths(scenario, args)
        if scenario.sends_goals:
            check_interfaces()
        report = scenario.run(args, not args.no_progress and sys.stderr.isatty())
    except ToolError as exc:  # bad input; or a deployment that failed, its nodes' last lines kept
        text = str(exc) if "\n" in str(exc) else one_line(exc)
        print(f"error: {text}", file=err, flush=True)
        return EXIT_USAGE
    except SystemExit as exc:  # --help
        return int(exc.code or 0)
    except KeyboardInterrupt:
        print("interrupted", file=err, flush=True)
        return EXIT_INTERRUPTED
    return report_out(scenario, args, report, out, err)


def report_out(scenario: Scenario, args: argparse.Namespace, report: dict, out: TextIO, err: TextIO) -> int:
    """The busy warning, the table, the JSON, the PNG and the failures; the exit status."""
    warning = busy_warning(scenario.busy_cores(report), os.cpu_count()) if scenario.busy_cores else None
    if warning:
        report.setdefault("notes", []).append(warning)
        print(f"warning: {warning}", file=err, flush=True)
    print(scenario.format_table(report), file=out, flush=True)
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=2, default=str) + "\n")
        print(f"wrote {args.json}", file=err, flush=True)
    if scenario.plot is not None and args.png is not None:
        try:
            scenario.plot(report, args.png)
            print(f"wrote {args.png}", file=err, flush=True)
        except ImportError:
            print("warning: no plot: matplotlib is not installed (pip install 'edge_llm_ros[bench]')", file=err)
    failures = scenario.failures(report)
    for line in failures:
        print(line, file=err, flush=True)
    failed = bool(failures) or (scenario.verdict is not None and not report[scenario.verdict])
    return EXIT_FAILED if failed else EXIT_OK


# -- what the reports share -------------------------------------------------------------------------


def fmt_value(value, spec: str, scale: float = 1.0) -> str:
    """``value`` (times ``scale``) formatted with ``spec``; "-" for a value not measured (None)."""
    return "-" if value is None else format(value * scale, spec)


def busy_cpu_seconds() -> float | None:
    """CPU seconds every process of this machine has used since boot (Linux /proc/stat; None elsewhere)."""
    try:
        fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


class CpuShare:
    """CPU time other processes used during a run, in cores (``cores``; None where not measurable)."""

    def __enter__(self) -> CpuShare:
        self.cores: float | None = None
        self._start = (busy_cpu_seconds(), time.process_time(), time.perf_counter())
        return self

    def __exit__(self, *exc) -> None:
        busy0, own0, wall0 = self._start
        busy1 = busy_cpu_seconds()
        wall = time.perf_counter() - wall0
        if busy0 is not None and busy1 is not None and wall > 0:
            self.cores = max(0.0, (busy1 - busy0) - (time.process_time() - own0)) / wall


def busy_warning(cores: float | None, cpu_count: int | None) -> str | None:
    """Other processes held ``cores`` of the machine's cores during a run: torch's OpenMP threads then
    stall behind them, unevenly. None below BUSY_CORES (or not measured)."""
    if cores is None or cores < BUSY_CORES:
        return None
    return (f"other processes kept {cores:.1f} of {cpu_count} cores busy during the run: timings are "
            "unreliable; rerun on an idle machine (--threads 1 is steadier on a shared one)")


def version_of(module: str) -> str:
    """An installed module's ``__version__`` ("?" when it has none or is missing)."""
    try:
        return __import__(module).__version__
    except Exception:  # noqa: BLE001 - metadata only
        return "?"


def machine_info(**extra: Any) -> dict:
    """A report's ``machine``: core count, platform, Python, and ``extra``."""
    return {"cpu_count": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
            **extra}


def utc_now() -> str:
    """A report's ``date``: now, UTC, to the second."""
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def progress_bar(total: int, desc: str, unit: str, enabled: bool):
    """A tqdm bar on stderr (``enabled``: the harness's progress flag)."""
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit=unit, file=sys.stderr, disable=not enabled, dynamic_ncols=True)
