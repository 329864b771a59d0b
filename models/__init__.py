"""The recipe's models: pure modules, their arguments and flavors, and how parallelism applies to them (the
TrainSpec that wires them into torchtitan with the recipe's data, tokenizer and metrics is
`recipe.train.train_spec`)."""
