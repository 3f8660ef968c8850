"""Capuchin (Peng et al., ASPLOS'20): the planner (`planner`), its options
and candidates (`options`), its hybrid swap-or-recompute choice (`hybrid`)
and the timeline measured from a first run (`measured`)."""
