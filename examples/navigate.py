"""Send the robot an instruction and wait for its episode (`edge-llm-ros launch go2_sim`)."""
import sys

from edge_llm_ros.client import NavigatorClient

instruction = sys.argv[1] if len(sys.argv) > 1 else "go to the red chair"

with NavigatorClient("/edge_llm") as nav:                # /edge_llm/instruction -> navigator/episode
    nav.wait_until_ready(timeout=300)                    # the navigator is lifecycle-active
    episode = nav.navigate(instruction, timeout=600)     # until the episode ends (stop, or a failure)
    print(f"{episode.outcome} after {episode.actions} actions; waited {episode.waiting_s:.1f} s for "
          f"decisions, first motion after {episode.first_motion_s} s")
