"""A peer process for runtime tests: echoes every custom message back, serves a service and an action.

    /rt_test/<Type>       -> republished unchanged on /rt_test/<Type>/back
    /rt_test/profile      edge_llm_ros/srv/Profile: echoes token_counts, latency = n / 2
    /rt_test/generate     edge_llm_ros/action/Generate: max_new_tokens feedback messages
                          (token_ids=[i], text_delta=str(i)); prompt 'hold' keeps going
                          until canceled
"""

import threading

from edge_llm_ros import runtime as rt
from edge_llm_ros.runtime.interfaces import registry

CUSTOM = sorted(n for n in registry().store.fielddefs if n.startswith("edge_llm_ros/msg/"))


def main() -> None:
    rt.init()
    node = rt.Node("echo_peer", namespace="rt_test")
    for name in CUSTOM:
        short = name.rsplit("/", 1)[-1]
        pub = node.create_publisher(name, f"{short}/back", 100)
        node.create_subscription(name, short, pub.publish, 100)

    Profile = rt.service("edge_llm_ros/srv/Profile")

    def profile(request, response):
        response.success = True
        response.device = "peer"
        response.token_counts = request.token_counts
        response.latency_ms = [n / 2 for n in request.token_counts]
        return response

    node.create_service(Profile, "profile", profile)
    Generate = rt.action("edge_llm_ros/action/Generate")

    def execute(handle):
        goal = handle.request
        i = 0
        stop = threading.Event()
        while goal.prompt == "hold" or i < goal.max_new_tokens:
            if handle.is_cancel_requested:
                handle.canceled()
                return Generate.Result(text="cancelled", finish_reason="cancelled", token_ids=list(range(i)))
            handle.publish_feedback(Generate.Feedback(token_ids=[i], text_delta=str(i)))
            i += 1
            if goal.prompt == "hold":
                stop.wait(0.01)
        handle.succeed()
        return Generate.Result(text=goal.prompt, token_ids=list(range(i)), finish_reason="length")

    rt.ActionServer(node, Generate, "generate", execute, cancel_callback=lambda h: rt.CancelResponse.ACCEPT)
    print("READY", flush=True)
    try:
        rt.spin(node)
    except KeyboardInterrupt:
        pass
    rt.shutdown()


if __name__ == "__main__":
    main()
