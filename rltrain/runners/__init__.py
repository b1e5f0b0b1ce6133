"""Driver loops (reasoning, embodied) and what they share: sizes, checkpoints."""
