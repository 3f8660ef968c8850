"""TENSILE (Zhang et al.): the planner (`planner`), its options (`options`),
one job's planning state (`job`), the recompute rounds (`recompute`) and the
plan updates from measured latencies (`update`)."""
