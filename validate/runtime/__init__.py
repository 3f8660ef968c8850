"""A plan exported to a real PyTorch training loop. Imports only
`memplan.traces` and `memplan.planners`: users of the runtime load neither
SimPy nor the replay engine."""
