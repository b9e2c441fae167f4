"""torchtitan pieces of the training role: model from a HF config, batch, role context."""
