"""Engines behind small protocols: state movers, weight sync, DeepSpeed and vLLM backends.

Import-light on purpose: ``import rltrain.backends`` loads neither torch nor any GPU engine;
each submodule imports what it needs, and the GPU engines (DeepSpeed, vLLM) import lazily.
"""
