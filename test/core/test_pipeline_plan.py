"""Planning a stage pipeline (core/planning/pipeline_plan.py): the predictions against hand-computed ones, the
segment chosen per hardware, 32 layers x 8 devices planned end to end within seconds (slow: the serial pass), the params
file read back and accepted by the launcher, the Plan message, the devices file, memory refusals
that measure nothing, and `edge-llm-ros plan --pipeline`."""

from __future__ import annotations

import io
import re
import time
from pathlib import Path

import numpy as np
import pytest

from edge_llm_ros.core.pipeline.schedulers import FlowSpecShape
from edge_llm_ros.core.planning.costs import LayerProfile, Link
from edge_llm_ros.core.planning.partition import PartitionError, check_ranges, plan_layers
from edge_llm_ros.core.planning.pipeline_plan import (
    GHIDORAH,
    SEGMENTS,
    AcceptanceCurve,
    Devices,
    DeviceSpec,
    ModelShape,
    PipelinePlan,
    PlanRequest,
    model_shape,
    plan_pipeline,
    read_devices,
    stage_devices,
)

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "config" / "devices.example.yaml"
MB = 10**6


def shape(layers: int = 32, layer_mb: float = 10.0, hidden: int = 1024) -> ModelShape:
    """A model of ``layers`` equal layers: 4 KV heads of 64 at float32, embedding and head 40 MB each."""
    return ModelShape(layers, hidden, 4, 64, 32000, 4, (int(layer_mb * MB),) * layers, 40 * MB, 40 * MB)


def gpu_like(name: str, ms: float, memory_mb: float = 4000) -> DeviceSpec:
    """Flat up to 64 rows (launch-bound), then compute-bound."""
    return DeviceSpec.tabled(name, {1: ms, 64: 1.2 * ms, 512: 6 * ms}, int(memory_mb * MB), Link(1e-3, 1e9))


def cpu_like(name: str, ms: float, memory_mb: float = 4000) -> DeviceSpec:
    """Every row costs about as much as the first (compute-bound from one row)."""
    return DeviceSpec.tabled(name, {1: ms, 64: 40 * ms}, int(memory_mb * MB), Link(1e-3, 1e9))


def eight_devices() -> Devices:
    speeds = (0.5, 0.6, 0.6, 0.8, 0.5, 1.0, 0.7, 0.9)
    return Devices(tuple((gpu_like if i % 2 else cpu_like)(f"d{i}", ms) for i, ms in enumerate(speeds)))


# -- the predictions ------------------------------------------------------------------------------


def test_the_predictions_are_the_models_in_the_docstring_worked_by_hand():
    """Two devices, layers 1 ms at any row count, the head 2 ms, 1 ms links, a draft level 1 ms, τ(24) = 3:
    Eq. 1 puts 3 layers (+ link) on d0 and 1 (+ head + link back) on d1, 4 ms each, so L = 8 ms."""
    devices = Devices(tuple(DeviceSpec.tabled(f"d{i}", {1: 1.0}, 10**9, Link(1e-3), {1: 2.0}) for i in range(2)),
                      AcceptanceCurve((24,), (3.0,), "given"), draft_s=1e-3)
    plan = plan_pipeline(devices, shape(layers=4), PlanRequest(prompt_len=32))
    assert plan.layers == "0-2,3-3" and [s.seconds for s in plan.stages] == pytest.approx([4e-3, 4e-3])
    got = {p.mode: p.tokens_per_s for p in plan.predictions}
    assert got["ar"] == pytest.approx(1 / 8e-3)  # one row round the 8 ms loop
    # τ(24) a round: 25 rows in 4 chunks of 8, the loop and 3 more at the slowest stage, + 6 draft levels
    assert got["chunk_pp"] == pytest.approx(3.0 / (8e-3 + 3 * 4e-3 + 6e-3))
    # 8-row segments, 3 in flight: a turn every max(4, 4, (8 + 4) / 3) = 4 ms; τ(24) = 3 per 3 turns
    assert (plan.mode, plan.segment, plan.in_flight, got["flowspec"]) == ("flowspec", 8, 3, pytest.approx(250.0))
    assert [p.tokens_per_s for p in plan.predictions] == sorted(got.values(), reverse=True)
    assert plan.prefill_chunks == (32,)  # chunks cost 4 ms whatever their size: one chunk is fastest (Eq. 4)
    assert "a turn every 4.0 ms" in plan.predictions[0].why and plan.reason.startswith("flowspec: 250.0 tok/s")


def test_the_segment_follows_the_hardware():
    """Ghidorah's ARCA: where rows are nearly free (a GPU) FlowSpec verifies wider segments than where
    every row costs (a CPU); the Eq. 1 split is the one at the chosen segment's rows."""
    model = shape()
    gpus = plan_pipeline(Devices(tuple(gpu_like(f"g{i}", 0.5) for i in range(4))), model)
    cpus = plan_pipeline(Devices(tuple(cpu_like(f"c{i}", 0.5) for i in range(4))), model)
    assert gpus.segment > cpus.segment and gpus.mode == "flowspec"
    devices = eight_devices()
    plan = plan_pipeline(devices, model)
    split = plan_layers(stage_devices(devices.devices, model, plan.segment, PlanRequest().cached, 4),
                        model.cost(PlanRequest().context))
    assert [s.layers for s in plan.stages] == list(split.ranges)


@pytest.mark.slow  # bounds a duration: the serial pass, with a margin for a loaded 2-core machine
@pytest.mark.serial
def test_32_layers_on_8_devices_are_planned_within_seconds():
    devices, model = eight_devices(), shape()
    start = time.perf_counter()
    plan = plan_pipeline(devices, model, PlanRequest(prompt_len=512))
    text = plan.to_yaml()
    elapsed = time.perf_counter() - start
    print(f"32 layers x 8 devices, a 512-token prompt: planned in {elapsed * 1e3:.0f} ms")
    assert elapsed < 5.0  # 0.7 s on the loaded 2-core machine
    check_ranges([s.layers for s in plan.stages], 32)
    assert all(s.bytes <= s.budget for s in plan.stages) and len(plan.stages) == 8
    assert sum(plan.prefill_chunks) == 512 and 1 < len(plan.prefill_chunks) <= 32
    assert plan.segment in SEGMENTS and 1 <= plan.in_flight <= 16
    assert {p.mode for p in plan.predictions} == {"ar", "chunk_pp", "flowspec"}
    assert PipelinePlan.from_yaml(text) == plan


# -- memory ---------------------------------------------------------------------------------------


def test_a_device_over_its_budget_is_refused_by_name_before_anything_is_measured():
    measured = []

    def measure(threads):
        measured.append(threads)
        raise AssertionError("measured a device of a plan that cannot fit")

    small = DeviceSpec.profiled("tiny-jetson", lambda: measure(1), 30 * MB, threads=1)
    devices = Devices((small, *eight_devices().devices[1:]))
    with pytest.raises(PartitionError, match=r"tiny-jetson needs at least .* budget 30 MB"):
        plan_pipeline(devices, shape())
    assert not measured
    # the KV cache counts: a 20 MB layer + 40 MB embedding or head fit in 65 MB with 5 MB to spare,
    # 2 kB a row: 32 rows do, 4024 (8.2 MB) do not
    fits = Devices(tuple(gpu_like(f"g{i}", 0.5, memory_mb=65) for i in range(2)))
    plan_pipeline(fits, shape(layers=2, layer_mb=20), PlanRequest(prompt_len=8, new_tokens=0))
    with pytest.raises(PartitionError, match=r"g0 needs at least 68.24 MB .* budget 65 MB"):
        plan_pipeline(fits, shape(layers=2, layer_mb=20), PlanRequest(prompt_len=4000, new_tokens=0))


# -- the params file and the launcher -------------------------------------------------------------


@pytest.fixture(scope="module")
def plan() -> PipelinePlan:
    devices = Devices(tuple(gpu_like(f"jetson{i}", 0.5 + 0.1 * i) for i in range(3)))
    return plan_pipeline(devices, shape(layers=30), PlanRequest(prompt_len=100))


def test_the_params_file_reads_back_and_refuses_edits(plan):
    text = plan.to_yaml()
    assert PipelinePlan.from_yaml(text) == plan
    assert text.count(f'layers: "{plan.layers}"') == 2 and "# mode " in text and "pred tok/s" in text
    edited = text.replace(f'layers: "{plan.layers}"', 'layers: "0-1,2-20,21-29"', 1)  # every node's, not the record's
    with pytest.raises(ValueError, match=r"layers:=0-1,2-20,21-29 were edited .*plan again"):
        PipelinePlan.from_yaml(edited)
    with pytest.raises(ValueError, match="not a pipeline plan"):
        PipelinePlan.from_yaml("/**:\n  ros__parameters:\n    layers: '0-29'\n")


def test_the_launcher_accepts_the_plan(plan, tmp_path, capsys):
    """`plan:=FILE` layers the plan over config/stages.yaml: its stages and draft_node start with its
    parameters (a later ROS 2 params file wins), a launch argument still overrides it, and a plan
    edited since it was made, or a missing file, is refused before anything starts. The plan's
    launch arguments alone do the same."""
    from edge_llm_ros.runtime.launcher import LaunchError, apply_launch_args, load_plan
    from edge_llm_ros.runtime.launcher import main as launch
    from edge_llm_ros.runtime.params import RosArgs, parse_ros_args

    path = tmp_path / "plan.yaml"
    path.write_text(plan.to_yaml())
    stages = [f"stage_{i}" for i in range(len(plan.stages))]
    for arguments in ([f"plan:={path}"], plan.launch_arguments()):
        launch_plan = load_plan("stages")
        apply_launch_args(launch_plan, [*arguments, "wire_dtype:=float16"])
        assert [n.name for n in launch_plan.nodes] == [*stages, "draft_node"]
        for node in launch_plan.nodes:
            command = node.command(launch_plan.params_files)
            given: RosArgs = parse_ros_args(command[command.index("--ros-args"):])
            params = given.parameters(node.fqn)  # as the node reads them: params files in order, then -p
            assert params["layers"] == plan.layers and params["wire_dtype"] == "float16"
            if node.name == "draft_node":
                assert (params["mode"], params["segment"], params["in_flight"], params["prefill_chunk"]) == \
                       (plan.mode, plan.segment, plan.in_flight, plan.prefill_chunk)
    assert launch(["stages", f"plan:={path}", "-s"]) == 0
    shown = capsys.readouterr().out
    assert f"layers:={plan.layers}" in shown and "plan:=FILE    a params file layered over " in shown

    edited = tmp_path / "edited.yaml"
    edited.write_text(plan.to_yaml().replace(f"segment: {plan.segment}", f"segment: {plan.segment + 1}", 1))
    for bad, message in ((edited, r"plan:=.*edited.yaml: the plan's segment:=\d+ were edited"),
                         (tmp_path / "none.yaml", r"launch argument plan:=.*none.yaml: no such params file")):
        with pytest.raises(LaunchError, match=message):
            apply_launch_args(load_plan("stages"), [f"plan:={bad}"])


def test_the_plan_message_carries_the_deployment(plan):
    from edge_llm_ros import runtime as rt
    from edge_llm_ros.nodes.wire import pipeline_plan_fields, pipeline_plan_of

    msg = rt.message("edge_llm_ros/msg/Plan")(**pipeline_plan_fields(plan, ["/a", "/b", "/c"]))
    assert list(msg.stage_nodes) == ["/a", "/b", "/c"] and list(msg.prefill_chunks) == list(plan.prefill_chunks)
    back = pipeline_plan_of(msg)
    assert [s.layers for s in back.stages] == [s.layers for s in plan.stages]
    assert (back.mode, back.segment, back.in_flight, back.prefill_chunks, back.reason) == \
           (plan.mode, plan.segment, plan.in_flight, plan.prefill_chunks, plan.reason)
    assert (msg.segment, msg.in_flight) == (plan.segment, plan.in_flight) and plan.in_flight == len(plan.stages)
    assert msg.tree_width == FlowSpecShape().init_size  # the initial tree, no longer the segment
    assert back.tokens_per_s == pytest.approx(plan.tokens_per_s, rel=1e-6)  # float32 in the message


# -- inputs ---------------------------------------------------------------------------------------


def test_the_example_devices_file_plans_jupiters_environment_b():
    devices = read_devices(EXAMPLE, measure=lambda threads: pytest.fail("the example measures nothing"))
    assert [d.name for d in devices.devices] == ["xavier_nx", "tx2_a", "tx2_b", "nano"]
    assert devices.devices[0].memory_bytes == 6000 * MB and devices.devices[0].link == Link(1e-3, 1e9)
    plan = plan_pipeline(devices, shape(layers=30, layer_mb=14.2, hidden=576))
    check_ranges([s.layers for s in plan.stages], 30)
    assert len(plan.stages[3].layers) < len(plan.stages[0].layers)  # the Nano, slowest, gets the fewest


@pytest.mark.parametrize("entry, message", [
    ("{name: a, memory_mb: 10, layer_ms: 1, speed: 2}", "device 0 (a): unknown key(s) speed"),
    ("{name: a, layer_ms: 1}", "device 0 (a): missing 'memory_mb'"),
    ("{name: a, memory_mb: 10, layer_ms: {1: 0}}", "device 0 (a): costs are {rows >= 1: ms > 0}"),
    ("{name: a, memory_mb: 10}", "give either layer_ms"),
    ("{name: a, memory_mb: 10, layer_ms: 1, profile: {threads: 1}}", "give either layer_ms"),
])
def test_a_bad_devices_file_names_the_device_and_key(tmp_path, entry, message):
    path = tmp_path / "devices.yaml"
    path.write_text(f"devices:\n  - {entry}\n")
    with pytest.raises(ValueError, match=re.escape(message)):
        read_devices(path, measure=lambda threads: None)


def test_profiled_devices_are_measured_once_per_thread_count_when_first_costed(tmp_path):
    calls = []
    profile = LayerProfile([1, 8], [0, 512], [[1e-3, 2e-3], [2e-3, 4e-3]], [5e-3, 9e-3], 1, "fake")
    path = tmp_path / "devices.yaml"
    path.write_text("devices:\n" + "".join(f"  - {{name: c{i}, memory_mb: 2000, profile: {{threads: 1, scale: {s}}}}}\n"
                                           for i, s in enumerate((1, 2))))
    devices = read_devices(path, measure=lambda threads: calls.append(threads) or profile)
    assert calls == []
    plan_pipeline(devices, shape(layers=8))
    assert calls == [1]
    c0, c1 = devices.devices
    assert c1.layer(np.array([8]), np.array([512]))[0] == pytest.approx(2 * 4e-3) == 2 * c0.layer(8, 512)
    assert c0.head(np.array([1]))[0] == pytest.approx(5e-3) and c1.source.endswith("x2")


def test_a_measured_acceptance_curve_takes_the_best_at_each_width():
    from edge_llm_ros.core.planning.planner import Measurements

    m = Measurements.from_record({"row_costs_ms": {"torch": {"1": 10.0}}, "drafts": [
        {"backend": "torch", "ms_per_token": 5.0, "tau": {"1": 1.5, "2": 1.8, "3": 1.7},
         "trees": [{"tree": {"depth": 3, "branch": 2, "expand": 2, "width": 6}, "tau": 2.2, "draft_ms": 9.0}]}]})
    curve = AcceptanceCurve.measured(m)
    assert curve.nodes == (1, 2, 3, 6) and curve.tokens == (1.5, 1.8, 1.8, 2.2)  # never falls with width
    assert curve(0) == 1.0 and curve(64) == 2.2 and "measured" in curve.source
    assert GHIDORAH(63) == 3.34 and "assumed" in GHIDORAH.source


def test_smollm2s_shape_is_read_from_its_headers():
    from edge_llm_ros.core.engine.models import weights_folder

    model = model_shape(weights_folder())
    assert (model.num_layers, model.hidden_size, model.kv_heads, model.head_dim) == (30, 576, 3, 64)
    # q and o, k and v, the MLP, two norms; float32
    assert model.layer_bytes[0] == 4 * (2 * 576 * 576 + 2 * 192 * 576 + 3 * 576 * 1536 + 2 * 576)
    assert model.head_bytes == model.embed_bytes + 4 * 576 == 4 * 49152 * 576 + 4 * 576  # tied: the embedding again
    assert model.kv_bytes(100) == 2 * 3 * 64 * 4 * 100 and (model.draft_layers, model.draft_vocab) == (4, 8192)
    assert FlowSpecShape().init_size == PlanRequest().context - 128 - 64


# -- edge-llm-ros plan --pipeline -----------------------------------------------------------------


def run_plan(argv):
    from edge_llm_ros.tools import plan

    out, err = io.StringIO(), io.StringIO()
    return plan.main(argv, out=out, err=err), out.getvalue(), err.getvalue()


def test_plan_pipeline_prints_the_table_writes_the_file_and_the_launch_command(tmp_path, monkeypatch):
    from edge_llm_ros.core.planning.device_plan import PLAN_ENV

    monkeypatch.setenv(PLAN_ENV, str(tmp_path / "none.json"))  # no device plan: τ is the stated assumption
    out_path = tmp_path / "plan.yaml"
    code, out, err = run_plan(["--pipeline", "--devices", str(EXAMPLE), "--prompt-len", "96", "--out", str(out_path)])
    assert code == 0, err
    plan = PipelinePlan.from_yaml(out_path.read_text())
    assert sum(plan.prefill_chunks) == 96 and [s.device for s in plan.stages] == ["xavier_nx", "tx2_a", "tx2_b", "nano"]
    assert "xavier_nx" in out and "pred tok/s" in out and "τ: assumed: Ghidorah Table I" in out
    assert f"  ros2 launch edge_llm_ros stages.launch.py plan:={out_path}" in out.splitlines()
    assert f"  (or with its launch arguments: {' '.join(plan.launch_arguments())})" in out.splitlines()

    tight = tmp_path / "tight.yaml"
    tight.write_text(EXAMPLE.read_text().replace("memory_mb: 6000          # Table III: 8 GB\n", "memory_mb: 10\n", 1))
    code, out, err = run_plan(["--pipeline", "--devices", str(tight), "--out", str(tmp_path / "no.yaml")])
    assert code == 2 and err.startswith("error: refused, nothing loaded: no partition of 30 layers fits: tx2_a")
    assert not (tmp_path / "no.yaml").exists()
    code, _, err = run_plan(["--pipeline", "--device"])
    assert code == 2 and "not allowed with argument" in err
