"""The exact baseline, built in the sections of an OR-Tools CP-SAT model:
data (`data`), variables and constraints (`model`), redundant cuts (`cuts`),
solutions as integers (`solution`), their read-out as plans (`readout`), the
large-neighbourhood search (`lns`) and the planner entry point (`planner`)."""
