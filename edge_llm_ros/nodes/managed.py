"""The heavy nodes (serve_node, draft_node, verifier_node) as managed (lifecycle) nodes.

    unconfigured --configure--> inactive --activate--> active
                 <--cleanup---          <-deactivate--

- configure loads the model (:meth:`ManagedNode.load`); a load that fails leaves the node
  unconfigured and logs why;
- activate serves; deactivate refuses new requests (running ones finish): a goal is aborted and an
  instruction answered with an error that names the state and the command that activates it;
- cleanup frees the model (:meth:`ManagedNode.unload`), and the heap's free pages go back to the
  system, so the node's RSS drops (logged);
- shutdown and errors free it too;
- a shutdown signal (SIGINT, SIGTERM) during a load ends it at once (runtime/stopping.py), and
  the process stops.

The node's topics, services and action server exist in every state, so a request to a node that
is not active gets that error at once instead of waiting for a server that is not there.

`autostart` (true by default) takes the node to active at start by itself, as `ros2 run` and the
embedded launcher expect; a load that fails then ends the process (exit code 2, run_node). The
launch files under `ros2 launch` set it false and drive the transitions themselves (launch_ros
LifecycleNode and its transition events, launch_support.py); `ros2 lifecycle set` or
`edge-llm-ros lifecycle set` drives them by hand.
"""

from __future__ import annotations

import dataclasses
import gc
import os

from edge_llm_ros import runtime as rt
from edge_llm_ros.nodes.common import SelfStarting, trim_heap
from edge_llm_ros.nodes.parameters import declare, param

OK, FAILED = rt.TransitionCallbackReturn.SUCCESS, rt.TransitionCallbackReturn.FAILURE


@dataclasses.dataclass(frozen=True)
class ManagedParams:
    autostart: bool = param(True, "configure and activate at start (false: wait for `ros2 lifecycle set` "
                                  "or the launch file's transitions)")


@dataclasses.dataclass(frozen=True)
class QwenFrameParams(ManagedParams):
    """The frame size of a Qwen VLM (nav/qwen_vl.py): a navigator resizes its frames to it and
    its verifier reads them at it, so both declare it alike."""

    vlm_height: int = param(252, "Qwen VLM: frames are resized to this height (pixels, rounded to 28; a navigator "
                                 "and its verifier alike)", low=28, high=4096)
    vlm_width: int = param(336, "Qwen VLM: frames are resized to this width (pixels, rounded to 28; a navigator "
                                "and its verifier alike)", low=28, high=4096)

    @property
    def qwen_size(self):
        from edge_llm_ros.nav.qwen_vl import QwenImageSize

        return QwenImageSize(self.vlm_height, self.vlm_width)


def rss_mb() -> float:
    """This process's resident memory in MB (Linux's /proc; 0 elsewhere)."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6
    except (OSError, ValueError, IndexError):
        return 0.0


class ManagedNode(rt.LifecycleNode, SelfStarting):
    """A lifecycle node with a model: subclasses implement :meth:`load` and :meth:`unload` and ask
    :meth:`refusal` before they take a request."""

    def __init__(self, name: str, params_cls: type, defaults: dict | None = None, **kwargs) -> None:
        super().__init__(name, **{"namespace": "edge_llm", **kwargs})  # tests start nodes in namespaces of their own
        self.params = declare(self, params_cls, defaults)
        self.active = False
        self.loaded = False
        self.failure = ""  # why the last configure failed
        self.summary = ""  # what load() made, logged on activate

    def load(self) -> str:
        """Load the model and start serving it; a line saying what it serves (logged on activate),
        or ValueError or OSError saying why it cannot."""
        raise NotImplementedError

    def unload(self) -> None:
        """Stop and free what :meth:`load` made (also after a load that failed half-way)."""
        raise NotImplementedError

    def refusal(self) -> str:
        """'' when active; else the error a new request gets."""
        if self.active:
            return ""
        fqn, state = self.get_fully_qualified_name(), self.lifecycle_state.label
        steps = ["configure", "activate"] if state == "unconfigured" else ["activate"]
        return (f"inactive: {fqn} is {state}, not active ("
                + "; ".join(f"ros2 lifecycle set {fqn} {step}" for step in steps) + ")")

    def lifecycle_status(self, status, refused: str) -> None:
        """The lifecycle's part of the node's status (nodes/diagnostics.py): ERROR when the last
        configure failed, WARN while not active (``refused``: what the node refuses then)."""
        from edge_llm_ros.nodes.diagnostics import ERROR, WARN

        if self.failure:
            status.merge(ERROR, f"configure failed: {self.failure}")
        elif not self.active:
            status.merge(WARN, f"{self.lifecycle_state.label}, not active: {refused}")

    # -- transitions -------------------------------------------------------------------------------

    def on_configure(self, state):
        try:
            self.summary = rt.stoppable(self.load)  # SIGINT/SIGTERM end it at once, in any thread (runtime/stopping.py)
        except rt.Stopped:  # the process is stopping: free what the load made (no heap trim: see destroy_node)
            self.unload()
            raise
        except Exception as exc:  # any failure leaves the node unconfigured, with the reason
            self.failure = str(exc) or repr(exc)
            self.get_logger().error(f"configure failed: {self.failure}")
            self.release()
            return FAILED
        self.loaded, self.failure = True, ""
        self.get_logger().info(f"configured (RSS {rss_mb():.0f} MB); activate to serve")
        return OK

    def on_activate(self, state):
        self.active = True
        self.get_logger().info(f"active: {self.summary}")
        return OK

    def on_deactivate(self, state):
        self.active = False
        self.get_logger().info("inactive: new requests are refused")
        return OK

    def on_cleanup(self, state):
        before = rss_mb()
        self.release()
        self.get_logger().info(f"cleaned up: model freed, RSS {before:.0f} -> {rss_mb():.0f} MB")
        return OK

    def on_shutdown(self, state):
        self.active = False
        self.release()
        return OK

    def on_error(self, state):
        self.active = False
        self.release()
        return OK

    def release(self) -> None:
        """unload(), then give the freed heap back to the system."""
        self.unload()
        self.loaded = False
        gc.collect()
        trim_heap()

    @property
    def autostart(self) -> bool:
        """Its `autostart` parameter: run_node brings it up (:meth:`bring_up`) once it is built."""
        return self.params.autostart

    def bring_up(self) -> None:
        """configure, then activate; ValueError with the reason when configure fails."""
        if self.trigger_configure() != OK:
            raise ValueError(self.failure or "configure failed")
        if self.trigger_activate() != OK:
            raise ValueError("activate failed")

    def destroy_node(self) -> None:
        """Free what load() made, without release()'s gc.collect and heap trim: the process is usually
        ending (a full collection took 0.35-0.55 s here of the 2 s a node gets after SIGTERM)."""
        self.active = False
        if self.loaded:
            self.unload()
            self.loaded = False
        super().destroy_node()
