"""torchtitan pieces of the training role: model from a HF config, FSDP2 sharding,
rows of a checkpoint, the role context."""
