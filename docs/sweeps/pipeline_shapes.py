"""The pipeline projection's trees, swept: FlowSpec and Chunk-PP tokens/s on the projected Jetson-class
stages (core/planning/costs.jetson_costs, the same simulator and inputs as `bench --scenario pipeline`) for
tree shapes other than FlowSpec's own evaluation setting (core/pipeline/schedulers.PAPER_SHAPE).

    python docs/sweeps/pipeline_shapes.py STAGES MODES SHAPE [SHAPE ...]
    python docs/sweeps/pipeline_shapes.py 8 flowspec,chunk_pp paper init_size=48,expand_size=32

STAGES and MODES are comma-separated; a SHAPE is `paper` or comma-separated overrides of
PAPER_SHAPE's fields (init_size, expand_size, expand_depth, segment, ...). SmolLM2's target and
shipped draft give the tokens (the bench's prompts, as many as its projection runs); the seconds are
the projection's. About 35 s per shape and mode on the 2-core VM. Results: docs/pipeline.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import time

from tqdm import tqdm

from edge_llm_ros.core.pipeline.schedulers import PAPER_SHAPE
from edge_llm_ros.core.planning.costs import even_ranges, jetson_costs
from edge_llm_ros.tools import bench_pipeline as bench
from edge_llm_ros.tools.prompts import BENCH_PROMPTS


def shape_of(spec: str):
    if spec == "paper":
        return PAPER_SHAPE
    return dataclasses.replace(PAPER_SHAPE, **{k: int(v) for k, v in (item.split("=") for item in spec.split(","))})


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("stages", help="e.g. 4,8")
    p.add_argument("modes", help="e.g. flowspec,chunk_pp")
    p.add_argument("shapes", nargs="+", help="paper, or overrides such as init_size=48,expand_size=32")
    args = p.parse_args()
    setup = bench.prepare(list(BENCH_PROMPTS[: bench.PROMPTS]), bench.MAX_NEW_TOKENS, tqdm(disable=True))
    paper = jetson_costs(latency_s=1e-3)
    for stages in (int(s) for s in args.stages.split(",")):
        ranges = even_ranges(setup.target.config.num_hidden_layers, stages)
        for spec in args.shapes:
            shape = shape_of(spec)
            for mode in args.modes.split(","):
                started = time.perf_counter()
                timelines = [bench.simulate_one(setup, mode, ids, bench.MAX_NEW_TOKENS, paper.cost_model(stages),
                                                ranges=ranges, shape=shape)
                             for ids in setup.prompt_ids[: bench.PROJECTED_PROMPTS]]
                row = bench.simulated_row(setup, mode, "projected", timelines, stages=stages, device=paper.device,
                                          references=setup.references)
                print(f"{stages} stages  {spec:32s} {mode:9s} {row['tokens_per_s']:6.2f} tokens/s  ALT "
                      f"{row['alt']:.2f}  ALR {row['alr'] or 0:.2f}  stages busy {row['stage_utilization']:.2f}  "
                      f"lossless {row['lossless']}  ({time.perf_counter() - started:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
