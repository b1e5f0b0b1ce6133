"""Kinds: every engine, component and runner kind rltrain knows, each declared once.

An entry says what the kind needs (CUDA, a package, other components), what it allows (fusion,
tensor or pipeline parallelism), what it costs (its memory terms), which config checks it adds
and which class runs it (by import string, so this package stays pure: no torch, no Ray). The
planner, the pre-Ray checks, fusion, the worker builders, ``whatif`` and ``autoplace`` ask
:mod:`rltrain.kinds.registry` instead of testing names; the allowed values of ``actor.backend``,
``rollout.backend`` and ``runner`` are its names.
"""
