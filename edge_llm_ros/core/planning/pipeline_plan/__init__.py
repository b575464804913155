"""Planning a stage pipeline (issue 14): which device runs which layers, how a prompt is chunked,
FlowSpec's segment and segments in flight, and the speed each pipeline mode is predicted to reach.

Contract: :class:`Devices` (a devices file, :func:`read_devices`, or :func:`default_devices`) and
a :class:`ModelShape` (:func:`model_shape`) in, a :class:`PipelinePlan` out
(:func:`plan_pipeline`: milliseconds, nothing measured or loaded; a device whose memory budget
cannot hold its share is a PartitionError naming it, before any cost is asked for). A plan is a
ROS 2 params file for launch/stages.launch.py and msg/Plan's fields. Every number in it is a
prediction. Knows nothing about ROS.

The modules: devices.py the inputs (the model's shape and bytes, the devices and their costs, τ),
profile.py this machine's costs (a LayerProfile measured here once and saved), predict.py the
planning (Jupiter's Eq. 1-4, Ghidorah's ARCA for the segment, every mode's prediction), plan.py
the plan as data (params file, message).
"""

from .devices import (
    DEFAULT_LINK,
    GHIDORAH,
    AcceptanceCurve,
    Devices,
    DeviceSpec,
    ModelShape,
    ProfileCost,
    available_memory,
    default_devices,
    model_shape,
    read_devices,
    row_curve,
)
from .plan import PLAN_ENTRY, SEGMENTS, ModePrediction, PipelinePlan, PlanRequest, StagePlan
from .predict import (
    ANSWER_BYTES,
    best_flowspec,
    bottleneck_cost,
    check_budgets,
    draft_seconds,
    plan_pipeline,
    stage_devices,
    stage_seconds,
    stage_times,
)
from .profile import PROFILE_FORMAT, load_profile, measure_here, save_profile, saved_profile

__all__ = [
    "ANSWER_BYTES", "DEFAULT_LINK", "GHIDORAH", "PLAN_ENTRY", "PROFILE_FORMAT", "SEGMENTS", "AcceptanceCurve",
    "DeviceSpec", "Devices", "ModePrediction", "ModelShape", "PipelinePlan", "PlanRequest", "ProfileCost", "StagePlan",
    "available_memory", "best_flowspec", "bottleneck_cost", "check_budgets", "default_devices", "draft_seconds",
    "load_profile", "measure_here", "model_shape", "plan_pipeline", "read_devices", "row_curve", "save_profile",
    "saved_profile", "stage_devices", "stage_seconds", "stage_times",
]
