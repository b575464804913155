"""`python -m edge_llm_ros.runtime.launcher ...`: the same as `edge-llm-ros launch ...`."""

from .command import main

raise SystemExit(main())
