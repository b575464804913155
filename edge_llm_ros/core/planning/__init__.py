"""Deciding how to run: the device plan (measure this machine, score every backend and mode: device_profile.py,
planner.py, device_plan.py; what a plan holds for, the model's content and the machine: identity.py),
Jupiter's partition of layers and prompt chunks (partition.py), the stage pipeline's plan
(pipeline_plan/), and what a step costs, measured or cited (costs.py).

Imports core/engine, drafts and pipeline; never core/sim or core/training.

Knows nothing about ROS.
"""
