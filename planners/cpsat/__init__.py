"""The exact baseline, built in the sections of an OR-Tools CP-SAT model:
data (`data`, with the recompute points of `chains`), records (`spec`),
variables and constraints (`model`, with `memory` and the redundant `cuts`),
solving one model (`solve`), solutions as integers (`solution`) and as plans
(`readout`), a run (`search`, with other planners' plans as warm starts in
`hints` and the large-neighbourhood search `lns`), its result (`outcome`),
the options (`options`) and the planner entry point (`planner`)."""
