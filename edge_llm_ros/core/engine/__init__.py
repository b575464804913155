"""The engine: causal LMs driven by our own loop (torch over Hugging Face modules, llama.cpp through
llama-cpp-python), KV caches, sampling, token trees, verification, the decoding modes ar, sd, tree
and llmcad (decoding.py), serving many requests (batching.py), grammars (constraint.py), and the
Drafter interface every draft plugs into (drafters.py).

Imports nothing else of edge_llm_ros.core.

Knows nothing about ROS.
"""
