"""rltrain: RL post-training where placement is configuration.

Import-light on purpose: ``import rltrain`` loads neither Ray nor torch.
"""

__version__ = "0.1.0"
