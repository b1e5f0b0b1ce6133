"""rltrain's Hydra plugins: the placement-aware launcher and the config search path.

Kept empty on purpose: Hydra imports every plugin package while scanning, so anything heavy here
would slow down every Hydra app on the machine.
"""
