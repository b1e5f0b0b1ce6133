"""Cross-field checks of the engines (``actor.backend``, ``rollout.backend``, ``reward.kind``,
``weight_sync``): options a run could not honour are refused here, before Ray starts.

Registered with :func:`rltrain.config.validate.check`; imported by that module, so every
``load_config`` runs them.
"""

from __future__ import annotations
