"""The real schedulers, stages, drafters and verifiers with only time simulated: the stage pipeline
(pipeline.py) and edge-cloud decoding (edge_cloud.py). The benches project what a deployment this
machine cannot host would do; every projection is labelled so.

The top of core: imports the rest of it, and nothing imports it but benches and nav.

Knows nothing about ROS.
"""
