"""Ask the launched pipeline (`edge-llm-ros launch pipeline`) from Python: wait, generate, stream."""
import sys

from edge_llm_ros.client import LLMClient

prompt = sys.argv[1] if len(sys.argv) > 1 else "Name three things a robot needs to see."

with LLMClient("/edge_llm") as llm:                      # the generate action of /edge_llm
    print("ready:", llm.wait_until_ready(timeout=300))   # its node is lifecycle-active
    result = llm.generate(prompt, max_new_tokens=32)     # greedy: the same text every time
    print(f"{result.text}\n[{len(result.token_ids)} tokens, {result.stats.tokens_per_s:.1f} tokens/s]")
    for chunk in llm.stream(prompt, max_new_tokens=32):  # the same answer, as it comes
        print(chunk.text, end="", flush=True)
    print()
