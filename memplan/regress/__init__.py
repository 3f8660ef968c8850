"""The regression gate: a suite of scenarios with tolerances per metric
(`suite`), a baseline of their figures (`baseline`), and the diff of a run
against it (`diff`); `memplan regress` runs them (docs/regress.md)."""
