"""The target as a chain of stages (Jupiter, FlowSpec): a stage runs a layer range over rows with its
own KV caches (stages.py); the draft side's schedulers decide what goes through them (schedulers.py:
ar, chunk_pp, flowspec); outline decoding expands an outline's points as concurrent requests
(outline.py, not lossless).

Imports core/engine only. The wire form of rows (HiddenStates) lives on the node side (nodes/wire.py).

Knows nothing about ROS.
"""
