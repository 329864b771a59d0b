"""The names `LighthouseConfig.selection` accepts, the one definition of them. Plain Python that imports nothing, so
a command line can check a study's selections before its heavy imports (`recipe.experiments.payoff_grid` executes
this file on its own: importing it as `lighthouse.modes` would run the package's `__init__`, which imports torch)."""

SELECTIONS = ("paper", "causal", "strict")
