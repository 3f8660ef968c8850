"""Sweeps: a grid of scenarios (`grid`), each run to one record (`scenario`),
on a process pool or a Ray cluster (`backends`), streamed to results.jsonl
with resume (`store`), summarised per planner (`summary`)."""
