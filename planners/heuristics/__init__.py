"""One module per heuristic planner: vanilla and release-after-last-use,
TENSILE, Capuchin, vDNN and sqrt(n) checkpointing."""
