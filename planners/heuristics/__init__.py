"""The heuristic planners, one module or package each: vanilla and
release-after-last-use, TENSILE, Capuchin, vDNN, sqrt(n) checkpointing and
AutoSwap."""
