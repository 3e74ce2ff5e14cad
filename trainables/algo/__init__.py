"""The algorithm: what GRPO, LUFFY and OGER compute from a batch (losses, advantages, log-probs, the
hybrid group, micro-batches) and the presets that name them. Pure functions of tensors, no framework."""
