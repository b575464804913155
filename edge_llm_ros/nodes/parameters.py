"""A node's parameters as one dataclass: declared with descriptors, checked in one place.

    @dataclasses.dataclass(frozen=True)
    class FrontDoorParams:
        max_requests: int = param(16, "requests decoded at once", low=1, high=256)
        mode: str = param("", "decoding mode ('' = the plan's)", choices=("", "ar", "sd"))
        stats_period_s: float = param(1.0, "aggregate stats period (0 = off)", low=0.0, dynamic=True)

    self.door = declare(self, FrontDoorParams)    # in the node's __init__

Each field is declared on the node with a ParameterDescriptor (rcl_interfaces): its type, its
description, its range (an integer or floating-point range) and `read_only` unless it is
`dynamic`. So `ros2 param describe` shows them, and under rclpy `ros2 param set` refuses a value
out of range with the range in the message. A read-only parameter is one whose change would need
a reload; it is refused at run time. A dynamic one is applied by the node at once
(:func:`on_change`). A value out of range or not among the choices at start is a ValueError that
names the parameter, the same on both backends, and the node exits with code 2 (run_node).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable

from edge_llm_ros import runtime as rt

INT_LIMIT = 2 ** 63 - 1  # rcl_interfaces ranges are int64


@dataclasses.dataclass(frozen=True)
class Spec:
    description: str
    low: float | None = None
    high: float | None = None
    choices: tuple[str, ...] = ()
    dynamic: bool = False  # applied at once when set; otherwise read-only (a change needs a reload)

    def check(self, name: str, value: Any) -> None:
        """ValueError naming the parameter and what it must be."""
        if self.choices and value not in self.choices:
            raise ValueError(f"parameter '{name}' must be one of {' | '.join(repr(c) for c in self.choices)}, "
                             f"got {value!r}")
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"parameter '{name}' must be a finite number, got {value}")
        if (self.low is not None and value < self.low) or (self.high is not None and value > self.high):
            raise ValueError(f"parameter '{name}' must be in {self.range_text()}, got {value}")

    def range_text(self) -> str:
        low = "-inf" if self.low is None else f"{self.low:g}"
        high = "inf" if self.high is None else f"{self.high:g}"
        return f"[{low}, {high}]"


def param(default: Any, description: str, *, low: float | None = None, high: float | None = None,
          choices: tuple[str, ...] = (), dynamic: bool = False) -> Any:
    """A dataclass field that is a node parameter (see the module docstring)."""
    return dataclasses.field(default=default, metadata={"spec": Spec(description, low, high, tuple(choices), dynamic)})


def specs(cls: type) -> dict[str, tuple[Any, Spec]]:
    """{name: (default, Spec)} of a parameters dataclass."""
    return {f.name: (f.default, f.metadata["spec"]) for f in dataclasses.fields(cls)}


def descriptor(name: str, default: Any, spec: Spec) -> Any:
    """The rcl_interfaces/msg/ParameterDescriptor of one parameter."""
    Descriptor = rt.message("rcl_interfaces/msg/ParameterDescriptor")
    text = spec.description + (f" (one of: {', '.join(repr(c) for c in spec.choices)})" if spec.choices else "")
    fields: dict[str, Any] = dict(name=name, description=text, read_only=not spec.dynamic)
    if isinstance(default, bool) or (spec.low is None and spec.high is None):
        return Descriptor(**fields)
    if isinstance(default, int):
        low = int(spec.low) if spec.low is not None else -INT_LIMIT
        high = int(spec.high) if spec.high is not None else INT_LIMIT
        fields["integer_range"] = [rt.message("rcl_interfaces/msg/IntegerRange")(from_value=low, to_value=high, step=0)]
    else:
        low = float(spec.low) if spec.low is not None else -math.inf
        high = float(spec.high) if spec.high is not None else math.inf
        fields["floating_point_range"] = [rt.message("rcl_interfaces/msg/FloatingPointRange")(
            from_value=low, to_value=high, step=0.0)]
    return Descriptor(**fields)


def declare(node: Any, cls: type, defaults: dict[str, Any] | None = None) -> Any:
    """Declare every parameter of dataclass ``cls`` on ``node`` and return their checked values as
    an instance of ``cls`` (its ``__post_init__`` checks what involves several of them).
    ``defaults``: other defaults for some of them (a front door's backend sets its own)."""
    values = {}
    for name, (default, spec) in specs(cls).items():
        default = (defaults or {}).get(name, default)
        value = node.declare_parameter(name, default, descriptor(name, default, spec)).value
        spec.check(name, value)
        values[name] = value
    return cls(**values)


def on_change(node: Any, cls: type, apply: Callable[[Any], None]) -> None:
    """Under rclpy, call ``apply(new params)`` after `ros2 param set` changed a dynamic parameter
    (rclpy has already refused read-only ones and values out of range). A value the dataclass's
    checks refuse is refused too. The embedded backend has no parameter services: nothing to do."""
    if rt.BACKEND != "rclpy":
        return
    from rcl_interfaces.msg import SetParametersResult

    known = specs(cls)

    def check(parameters: list) -> Any:
        current = {name: node.get_parameter(name).value for name in known}
        try:
            for p in parameters:
                if p.name in known:
                    known[p.name][1].check(p.name, p.value)
                    current[p.name] = p.value
            cls(**current)
        except ValueError as exc:
            return SetParametersResult(successful=False, reason=str(exc))
        return SetParametersResult(successful=True)

    def applied(parameters: list) -> None:
        if any(p.name in known for p in parameters):
            apply(cls(**{name: node.get_parameter(name).value for name in known}))

    node.add_on_set_parameters_callback(check)
    node.add_post_set_parameters_callback(applied)
