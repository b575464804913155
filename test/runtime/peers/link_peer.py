"""A publisher process for the link-emulation test: small and ~1 MB Images on /link_test/probe.

Run it with a params file that puts `probe` on an emulated link. Once a
subscriber matches, it publishes SMALL small Images about 10 ms apart, then
one 1 MB Image immediately followed by one more small one. Each message
carries its publish time (time.time_ns) in header.stamp and its sequence
number in header.frame_id. Prints SENT <n> when done, then spins until
terminated, like any node (run_node: a bad parameter exits 2).
"""

import threading
import time

import numpy as np

from edge_llm_ros import runtime as rt
from edge_llm_ros.nodes.common import run_node

SMALL = 20
BIG_BYTES = 1_000_000


def build():
    node = rt.Node("link_peer", namespace="link_test")
    Image = rt.message("sensor_msgs/msg/Image")
    Header = rt.message("std_msgs/msg/Header")
    Time = rt.message("builtin_interfaces/msg/Time")
    pub = rt.shaped(node, node.create_publisher(Image, "probe", 100))

    def image(seq: int, size: int):
        now = time.time_ns()
        header = Header(stamp=Time(sec=now // 1_000_000_000, nanosec=now % 1_000_000_000), frame_id=str(seq))
        return Image(header=header, height=1, width=size, encoding="mono8", is_bigendian=0, step=size,
                     data=np.zeros(size, dtype=np.uint8))

    def work():
        if not pub.wait_for_subscribers(30):
            print("no subscriber on probe", flush=True)
            return
        pace = threading.Event()
        for seq in range(SMALL):
            pub.publish(image(seq, 64))
            pace.wait(0.01)  # workload pacing: messages apart, not queued behind each other
        pub.publish(image(SMALL, BIG_BYTES))
        pub.publish(image(SMALL + 1, 64))
        print(f"SENT {SMALL + 2}", flush=True)

    threading.Thread(target=work, daemon=True).start()
    return node


if __name__ == "__main__":
    raise SystemExit(run_node(build))
