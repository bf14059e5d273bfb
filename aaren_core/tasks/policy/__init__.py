"""The policy task: a return-conditioned policy (Decision Transformer layout) with an Aaren backbone."""
