"""A stand-in navigator in the test process, on a node host's backend: a lifecycle node named
navigator that hears ``instruction`` and, for each, publishes an episode summary latched on
``~/episode`` with navigator_node's keys (the instruction "ignore" gets none)."""

from __future__ import annotations

import json

from hosts import latched


class FakeNavigator:
    def __init__(self, host, namespace: str) -> None:
        self.host, self.episode = host, 0
        if host.backend == "rclpy":
            from rclpy.lifecycle import LifecycleNode

            self.node = LifecycleNode("navigator", namespace=namespace, context=host.context)
            host.executor.add_node(self.node)
        else:
            from edge_llm_ros.runtime.lifecycle import LifecycleNode

            self.node = LifecycleNode("navigator", namespace=namespace)
        self.String = host.message("std_msgs/msg/String")
        self.pub = self.node.create_publisher(self.String, "~/episode", latched(host))
        self.sub = self.node.create_subscription(self.String, "instruction", self.on_instruction, 10)

    def activate(self) -> None:
        self.node.trigger_configure()
        self.node.trigger_activate()

    def on_instruction(self, msg) -> None:
        if msg.data.strip() in ("", "ignore"):
            return
        self.episode += 1
        self.publish({"episode": self.episode, "instruction": msg.data.strip(), "outcome": "stop", "actions": 3,
                      "overlap": True, "waiting_s": 1.25, "waited_rounds": 2, "first_motion_s": 0.5, "frames": 9})

    def publish(self, summary) -> None:
        self.pub.publish(self.String(data=summary if isinstance(summary, str) else json.dumps(summary)))

    def close(self) -> None:
        if self.host.backend == "rclpy":
            self.host.executor.remove_node(self.node)
        self.node.destroy_node()
