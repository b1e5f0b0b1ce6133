"""The components as workers: each a plain class that owns its state (run by the runtime)."""
