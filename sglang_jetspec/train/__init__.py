"""Training JetSpec heads: target-regenerated data, block-causal forward-KL distillation."""
