"""Training what drafts: self-distilled draft models (distill.py), EAGLE-style heads (heads.py),
early exits (exits.py). Offline work for `edge-llm-ros train`; inference never imports it.

Knows nothing about ROS.
"""
