"""Planners that search over plans scored by a simulation the app shell
injects (`planners.core.evaluate`): `squeeze`, memplan's planner for memory
pressure."""
