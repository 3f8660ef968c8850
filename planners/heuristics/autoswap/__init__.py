"""AutoSwap (SmartPool/AutoSwap §IV): the planner (`planner`), candidates and
priority scores (`scores`), selection and scheduling (`schedule`), and the
Bayesian optimisation of the score weights (`bo`)."""
