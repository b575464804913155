"""edge_llm_ros.core: the engine and its science, token ids in, token ids out. No ROS anywhere.

Split by concern; the arrows point down only (test/test_layering.py enforces them):

    sim/        the stage pipeline and edge-cloud decoding with only time simulated
    planning/   the device plan, Jupiter's partition, the pipeline plan, what a step costs
    training/   self-distillation of drafts, heads and exits (offline; inference never imports it)
    edge_cloud/ EE's two halves: the robot's drafter and the server's early-exit verifier
    pipeline/   stages (a layer range and its caches), FlowSpec's schedulers, outline decoding
    drafts/     what inference loads to draft: trained draft models and heads, exits, GGUF drafts,
                models by name (loading.py)
    engine/     models (torch, llama.cpp), KV caches, sampling, trees, verification, decoding
                (ar, sd, tree, llmcad), batching, grammars

Nothing here imports rclpy, zenoh, edge_llm_ros.runtime, .nodes, .nav or .tools; nodes and the CLI
build these objects from their parameters and call them. Import what you use from its module
(``from edge_llm_ros.core.engine.decoding import generate``); this package re-exports nothing.
"""
