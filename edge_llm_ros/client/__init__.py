"""edge_llm_ros.client: the library users and tools call, on either runtime (rclpy when ROS 2 is
sourced, else the embedded Zenoh backend; edge_llm_ros.runtime picks). A few verbs hide the action
and topic plumbing, as nav2_simple_commander's BasicNavigator does:

    from edge_llm_ros.client import LLMClient, NavigatorClient

    with LLMClient() as llm:                          # /edge_llm/generate
        llm.wait_until_ready(60)                      # lifecycle-active, not a log line
        print(llm.generate("Name three colors.", max_new_tokens=32).text)
        for chunk in llm.stream("Tell me a story."):
            print(chunk.text, end="")

    with NavigatorClient() as nav:                    # /edge_llm/instruction -> /edge_llm/navigator/episode
        episode = nav.navigate("go to the red chair", timeout=300)

- llm.py: LLMClient (generate, stream, submit, wait_until_ready) and Request (a goal in flight:
  iterate, result, cancel);
- navigator.py: NavigatorClient (navigate, stop, wait_until_ready);
- records.py: Chunk, Result, Stats, Episode: plain records, no message classes;
- ready.py: readiness from the lifecycle state (get_state);
- transport.py: the two runtimes (a node of the client's own, or the caller's).

A request that does not end with an answer raises edge_llm_ros.errors' exception for its status
(Busy, Inactive, Invalid, PeerTimeout, PeerGone, Cancelled, Failed); no answer in time is NoAnswer
(a TimeoutError), a server that leaves is ServerGone (a PeerGone).

Imports: edge_llm_ros.runtime and edge_llm_ros.errors only (test/test_layering.py).
"""

from edge_llm_ros.client.llm import GENERATE, LLMClient, NoAnswer, Request, ServerGone, goal_fields
from edge_llm_ros.client.navigator import NavigatorClient
from edge_llm_ros.client.records import Chunk, Episode, Result, Stats
from edge_llm_ros.errors import Busy, Cancelled, Failed, Inactive, Invalid, PeerGone, PeerTimeout, RequestError, Status

__all__ = ["GENERATE", "Busy", "Cancelled", "Chunk", "Episode", "Failed", "Inactive", "Invalid", "LLMClient",
           "NavigatorClient", "NoAnswer", "PeerGone", "PeerTimeout", "Request", "RequestError", "Result",
           "ServerGone", "Stats", "Status", "goal_fields"]
