"""planner_node: the device plan for every node to follow, and predictions for deployments on request.

A managed (lifecycle) node (nodes/managed.py); its state says where the device plan is:

    unconfigured --configure--> inactive --activate--> active
                  (plan read or      (the plan is published
                   measured)          on `plan`: ready)

- configure reads the saved device plan (core.device_plan, measured by `edge-llm-ros plan --device`
  or by this node) for `model`. With `calibrate` auto, a missing plan, one measured for another
  model or machine, an unreadable one or one that keeps no measurements is replaced: the node
  measures this device with core.device_profile's FAST calibration (a log line per phase with the
  elapsed seconds; well under a minute on 2 cores) and saves the plan; `always` measures anyway.
  A shutdown signal ends a calibration at once (runtime/stopping.py), and nothing is saved.
  `never` without a usable plan fails the configure: the node stays up, unconfigured, its error
  saying why (the `plan` service answers success=false with it; pipeline plans still answer), and
  a later configure reads the plan again (after `edge-llm-ros plan --device`, say).
- activate publishes the plan on `plan` (logged: "published the device plan on ..."), so active
  means the plan is out. deactivate publishes nothing new (the last plan stays latched); cleanup
  forgets the measurements and frees the models `profile` loaded.

`autostart` (true by default) configures and activates at start, as `ros2 run` and the embedded
launcher expect; pipeline.launch.py under `ros2 launch` sets it false and drives the transitions
(launch_support.py). A client waits for the plan by waiting for the state `active`
(`~/get_state`, lifecycle_msgs/srv/GetState, or the `~/transition_event` topic). While it
calibrates, the node's services answer after it finishes.

Topic `plan` (edge_llm_ros/msg/Plan, transient local, depth 1: latched, a node started later gets
it): the device plan, published on activate, its reason saying why it won. Only the device plan
is published: a `plan` service answer is a prediction someone asked for, not an order, so it is
never put on the topic (no `publish_plans` switch: a node that wants a what-if plan has it in the
service response).

Services:
- `plan` (edge_llm_ros/srv/Plan): every candidate with its predicted tokens/s, the winner and why,
  scored by core.planner from the saved measurements alone (milliseconds, nothing is measured):
  deployment single (one device; objective throughput with concurrency n: ar batched on llama.cpp
  against speculative modes one request at a time) or edge_cloud (the robot drafts, the server
  verifies over a link of link_latency_ms one way, link_bandwidth_mbps). Deployment pipeline
  answers a stage pipeline plan (core.pipeline_plan) over the devices of `devices` ('' = this
  machine's two cores, one thread each): the stages' layers (stage_layer_begin/end; stage_nodes
  the request's names, else stage_<i>), prefill_chunks for a `prompt_len` prompt, mode, FlowSpec's
  segment and in_flight, the predicted tokens/s of ar, chunk_pp and flowspec and why. Devices
  measured here use a layer profile saved next to plan_file (measured at the first pipeline
  request when there is none: a few seconds, a log line per row count); τ: the devices file's,
  else the device plan's measured τ. A device whose memory budget cannot hold its share is
  answered success=false naming it. A bad request is answered success=false with the reason;
  the node goes on.
- `profile` (edge_llm_ros/srv/Profile): measures now, on the service thread: the target's cost of
  token_counts rows on a backend, the draft's ms per token, τ of sd for γ = 1..4 (quick: fewer
  repeats and tokens, every τ(γ) from one sd run). The models are loaded at the first request and
  kept; the start-up calibration frees its own.

Parameters: PlannerParams below (and ManagedParams' autostart), all read-only (a change needs a restart).
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

from edge_llm_ros import runtime as rt
from edge_llm_ros.nodes import diagnostics as diag
from edge_llm_ros.nodes.common import latched_qos, run_node, stamp
from edge_llm_ros.nodes.managed import OK, ManagedNode, ManagedParams
from edge_llm_ros.nodes.parameters import param
from edge_llm_ros.nodes.wire import pipeline_plan_fields

CALIBRATE = ("auto", "always", "never")
BACKENDS = ("torch", "llama.cpp")


@dataclasses.dataclass(frozen=True)
class PlannerParams(ManagedParams):
    model: str = param("", "the target: a .gguf file or an HF folder ('' = SmolLM2-135M-Instruct's GGUF)")
    plan_file: str = param("", "the device plan ('' = $EDGE_LLM_ROS_PLAN, else ~/.config/edge_llm_ros/plan.json)")
    calibrate: str = param("auto", "measure this device: auto (when no usable plan is saved), always or never",
                           choices=CALIBRATE)
    threads: int = param(0, "torch's and llama.cpp's threads while measuring (0 = torch's default)", low=0,
                         high=1024)
    allow_llama_cpp: bool = param(True, "false: plan as if llama-cpp-python were not installed (every plan on torch)")
    devices: str = param("", "pipeline plans: the devices file (see config/devices.example.yaml; '' = this "
                             "machine's two cores, one thread each, measured once and saved next to plan_file)")
    prompt_len: int = param(128, "pipeline plans: the prompt length the prefill chunks are planned for", low=1,
                            high=1_000_000)


class PlannerNode(ManagedNode):
    """A managed node (module docstring): configure reads or measures the device plan, activate
    publishes it, cleanup forgets it."""

    def __init__(self, **node_options) -> None:
        """``node_options``: rt.Node's (namespace, parameter_overrides: how tests start it in-process)."""
        super().__init__("planner_node", PlannerParams, **node_options)
        import torch

        from edge_llm_ros.core.engine.models import default_model_path
        from edge_llm_ros.core.planning.device_plan import default_plan_path

        params = self.params
        model, plan_file = params.model, params.plan_file
        if model and not Path(model).expanduser().exists():
            raise ValueError(f"parameter 'model': {model} not found")
        if params.devices and not Path(params.devices).expanduser().is_file():
            raise ValueError(f"parameter 'devices': {params.devices} not found")
        if self.params.threads:
            torch.set_num_threads(self.params.threads)
        self.model = Path(model).expanduser().resolve() if model else default_model_path().resolve()
        self.plan_path = Path(plan_file).expanduser() if plan_file else default_plan_path()
        self.subjects = None  # the models `profile` measures, loaded at its first request
        self.pipeline = None  # (Devices, ModelShape) of pipeline plans, read at the first such request
        self.PlanMsg = rt.message("edge_llm_ros/msg/Plan")
        self.plan_pub = self.create_publisher(self.PlanMsg, "plan", latched_qos())
        self.measurements, self.device_threads = None, 0  # while configured
        self.device_plan = None  # while configured: the device plan's winner (a core.planner Prediction) ...
        self.device_reason = ""  # ... and why it won
        self.no_plan = False  # the last configure failed for want of a plan (calibrate never)
        self.create_service(rt.service("edge_llm_ros/srv/Plan"), "plan", self.on_plan)
        self.create_service(rt.service("edge_llm_ros/srv/Profile"), "profile", self.on_profile)
        self.diagnostics = diag.Updater(self, hardware_id=f"{self.get_fully_qualified_name()} ({self.plan_path})")
        self.diagnostics.add("plan", self.diagnose)

    def diagnose(self, status: diag.Status) -> None:
        """ERROR when configure failed (no usable plan); WARN while not active; the device plan in force
        and its age (since it was measured: the plan file's time)."""
        plan = self.device_plan
        if plan is not None:
            c = plan.candidate
            status.summary(diag.OK, f"{c['mode']} on {c['backend']}, {c['tokens_per_s']:.1f} tokens/s expected")
        else:
            status.summary(diag.OK, "no device plan")
        self.lifecycle_status(status, "no device plan is published")
        status.add("lifecycle state", self.lifecycle_state.label)
        status.add("plan file", str(self.plan_path))
        try:
            status.add("plan age s", time.time() - self.plan_path.stat().st_mtime)
        except OSError:
            status.add("plan age s", -1.0)
        if plan is not None:
            status.add("mode", plan.candidate["mode"])
            status.add("backend", plan.candidate["backend"])
            status.add("expected tokens/s", float(plan.candidate["tokens_per_s"]))
            status.add("why", self.device_reason)

    # -- the lifecycle ---------------------------------------------------------------------------

    def load(self) -> str:
        """configure: the device plan, read or measured (ValueError with calibrate never and none usable)."""
        from edge_llm_ros.core.planning.planner import DeploymentRequest, plan_deployment

        self.no_plan = False
        self.measurements, self.device_threads = self.device_measurements()
        best = plan_deployment(self.measurements, DeploymentRequest())
        self.device_plan, self.device_reason = best.choice, best.reason
        return f"the device plan is on {self.resolve_topic_name('plan')}: {best.reason}"

    def unload(self) -> None:
        self.measurements, self.device_threads, self.device_plan, self.device_reason = None, 0, None, ""
        self.close_subjects()

    def on_activate(self, state):
        self.plan_pub.publish(self.plan_message(self.device_plan, self.device_reason))
        self.get_logger().info(f"published the device plan on {self.resolve_topic_name('plan')}: {self.device_reason}")
        return super().on_activate(state)

    def on_deactivate(self, state):
        self.active = False
        self.get_logger().info("inactive: no new device plan is published (the last one stays latched)")
        return OK

    def bring_up(self) -> None:
        """autostart: configure and activate. No usable plan with calibrate never leaves the node up and
        unconfigured (its services still answer) instead of ending the process; any other failure ends it."""
        try:
            super().bring_up()
        except ValueError:
            if not self.no_plan:
                raise

    # -- the device plan -------------------------------------------------------------------------

    def device_measurements(self):
        """(Measurements, threads) of the saved plan, calibrating first where `calibrate` says; ValueError
        (and no_plan set) when there is none to use (calibrate never)."""
        from edge_llm_ros.core.planning.device_plan import PlanError, load_plan
        from edge_llm_ros.core.planning.planner import load_measurements

        log = self.get_logger()
        why = "calibrate is always"
        if self.params.calibrate != "always":
            try:
                plan = load_plan(self.plan_path, self.model, warn=log.warning)
                if plan is None:
                    why = f"no device plan for {self.model.name} at {self.plan_path}"
                else:
                    measurements = load_measurements(self.plan_path)
                    log.info(f"device plan {self.plan_path}: {plan.describe()}")
                    return self.usable(measurements), plan.threads
            except (PlanError, ValueError) as exc:
                why = str(exc)
        if self.params.calibrate == "never":
            self.no_plan = True
            raise ValueError(f"{why}, and calibrate is never: no plan published (edge-llm-ros plan --device makes "
                             "one, or set calibrate:=auto)")
        log.info(f"{why}: calibrating this device")
        threads, measurements = self.calibrated()
        return self.usable(measurements), threads

    def calibrated(self):
        """Measure this device (FAST), save the plan; (threads, Measurements)."""
        from edge_llm_ros.core.planning.device_plan import save_plan
        from edge_llm_ros.core.planning.device_profile import FAST, calibrate
        from edge_llm_ros.core.planning.planner import Measurements

        log = self.get_logger()
        record = calibrate(self.model, self.params.threads or None, self.params.allow_llama_cpp, FAST, log.info)
        try:
            save_plan(record, self.plan_path)
            log.info(f"saved the device plan to {self.plan_path}")
        except OSError as exc:
            log.error(f"cannot save the device plan to {self.plan_path}: {exc} (serving it from memory)")
        return record["threads"], Measurements.from_record(record)

    def usable(self, measurements):
        """The measurements as this node may plan with them (without llama.cpp unless allowed)."""
        return measurements if self.params.allow_llama_cpp else measurements.without("llama.cpp")

    def plan_message(self, prediction, reason: str):
        c = prediction.candidate
        tree = c["tree"] or {}
        return stamp(self, self.PlanMsg(
            mode=c["mode"], backend=c["backend"], draft_backend=c["draft_backend"] or "", threads=self.device_threads,
            gamma=c["gamma"], tree_width=tree.get("width", 0), tree_depth=tree.get("depth", 0),
            tree_branch=tree.get("branch", 0), tree_expand=tree.get("expand", 0),
            expected_tokens_per_s=c["tokens_per_s"], reason=reason))

    # -- services --------------------------------------------------------------------------------

    def on_plan(self, request, response):
        from edge_llm_ros.core.planning.planner import DeploymentRequest, plan_deployment

        if request.deployment == "pipeline":
            return self.on_pipeline_plan(request, response)
        if self.measurements is None:  # not configured: why (a failed configure's reason, or the state)
            response.success, response.message = False, f"no device plan: {self.failure or self.refusal()}"
            return response
        try:
            asked = DeploymentRequest(request.deployment or "single", request.objective or "latency",
                                      request.concurrency or 1, float(request.link_latency_ms),
                                      float(request.link_bandwidth_mbps))
        except ValueError as exc:
            response.success, response.message = False, f"bad request: {exc}"
            return response
        answer = plan_deployment(self.measurements, asked)
        response.success, response.message = True, answer.reason
        response.plan = self.plan_message(answer.choice, answer.reason)
        response.candidates = [p.text for p in answer.candidates]
        response.predicted_tokens_per_s = [p.tokens_per_s for p in answer.candidates]
        return response

    def on_pipeline_plan(self, request, response):
        from edge_llm_ros.core.planning.partition import PartitionError
        from edge_llm_ros.core.planning.pipeline_plan import GHIDORAH, AcceptanceCurve, PlanRequest, plan_pipeline

        try:
            devices, model = rt.stoppable(self.pipeline_inputs)  # the first request measures the layer profile
            measured = AcceptanceCurve.measured(self.measurements) if self.measurements is not None else None
            plan = plan_pipeline(devices, model, PlanRequest(prompt_len=self.params.prompt_len), measured or GHIDORAH)
            if request.stage_nodes and len(request.stage_nodes) != len(plan.stages):
                raise ValueError(f"stage_nodes names {len(request.stage_nodes)} nodes for the plan's "
                                 f"{len(plan.stages)} stages (one per device)")
        except PartitionError as exc:
            response.success, response.message = False, f"pipeline refused, nothing loaded: {exc}"
            return response
        except (ValueError, OSError, RuntimeError) as exc:
            response.success, response.message = False, f"pipeline: {exc}"
            return response
        response.success, response.message = True, plan.reason
        response.plan = stamp(self, self.PlanMsg(**pipeline_plan_fields(plan, request.stage_nodes)))
        response.candidates = plan.candidates()
        response.predicted_tokens_per_s = [p.tokens_per_s for p in plan.predictions]
        return response

    def pipeline_inputs(self):
        """(Devices, ModelShape) of pipeline plans: the `devices` file (or this machine's two cores, their
        profile measured at first use and saved next to plan_file) and the target's shape; kept."""
        if self.pipeline is None:
            from edge_llm_ros.core.engine.models import weights_folder
            from edge_llm_ros.core.planning.pipeline_plan import (
                default_devices,
                model_shape,
                read_devices,
                saved_profile,
            )

            folder, say = weights_folder(self.model), self.get_logger().info
            path = self.plan_path.with_name("layer_profile.json")
            measure = lambda threads: saved_profile(path, folder, threads, say)  # noqa: E731
            devices = read_devices(Path(self.params.devices).expanduser(), measure) if self.params.devices else \
                default_devices(lambda: measure(1))
            self.pipeline = devices, model_shape(folder)
        return self.pipeline

    def on_profile(self, request, response):
        from edge_llm_ros.core.planning.device_profile import PREFIX

        planned, draft_backend = self.planned_backends()
        backend = request.backend or planned
        counts = [int(n) for n in request.token_counts] or list(range(1, 9))
        try:
            if backend not in BACKENDS:
                raise ValueError(f"backend must be one of {' | '.join(BACKENDS)} ('' = the plan's), got {backend!r}")
            if backend == "llama.cpp" and not self.params.allow_llama_cpp:
                raise ValueError("backend llama.cpp is not allowed here (allow_llama_cpp is false)")
            got = rt.stoppable(self.measure, backend, draft_backend, request.prefix_len or PREFIX, counts,
                               request.quick)  # seconds: a shutdown signal ends it (runtime/stopping.py)
        except (ValueError, OSError, RuntimeError, ImportError) as exc:
            response.success, response.message = False, f"profile failed: {exc}"
            return response
        response.success, response.message, response.device = True, f"measured {backend} on {got.device}", got.device
        response.token_counts, response.latency_ms = got.token_counts, got.latency_ms
        response.draft_ms_per_token, response.gammas, response.tau = got.draft_ms_per_token, got.gammas, got.tau
        return response

    def measure(self, backend: str, draft_backend: str, prefix: int, counts: list[int], quick: bool):
        """What `profile` measures (a core.device_profile ProfileResult), the models loaded at first."""
        from edge_llm_ros.core.planning.device_profile import load_subjects, profile

        if self.subjects is None:
            self.get_logger().info("profile: loading the models to measure")
            self.subjects = load_subjects(self.model, self.params.threads or None, llama_cpp=self.params.allow_llama_cpp)
        return profile(self.subjects, backend, draft_backend, prefix, counts, quick)

    def planned_backends(self) -> tuple[str, str]:
        """(target backend, draft backend) of the device plan: its draft's, for ar the draft cheapest per
        token; torch without a plan."""
        if self.device_plan is None:
            return "torch", "torch"
        c, drafts = self.device_plan.candidate, self.measurements.drafts
        cheapest = min(drafts, key=lambda d: d.ms_per_token).backend if drafts else "torch"
        return c["backend"], c["draft_backend"] or cheapest

    def close_subjects(self) -> None:
        """Free the models `profile` loaded (loaded again at its next request)."""
        subjects, self.subjects = self.subjects, None
        if subjects is not None:
            subjects.close()

    def destroy_node(self) -> None:
        self.close_subjects()
        super().destroy_node()


def main(args: list[str] | None = None) -> int:
    return run_node(PlannerNode, args)


if __name__ == "__main__":
    raise SystemExit(main())
