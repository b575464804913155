"""`python -m edge_llm_ros.runtime.launcher ...`: the same as `edge-llm-ros launch ...`."""

from edge_llm_ros.runtime.launcher.command import main

raise SystemExit(main())
