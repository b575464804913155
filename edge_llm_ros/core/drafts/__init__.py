"""What inference loads to draft: trained draft models and EAGLE-style feature heads
(draft_models.py), early exits (exits.py), drafts as GGUF for llama.cpp (gguf.py), and models and
drafters by name, as the CLI's flags and the nodes' parameters give them (loading.py).

Imports core/engine (and core/pipeline's partial loading); never core/training.

Knows nothing about ROS.
"""
