"""Multi-turn rollouts: the procedure that runs an interaction (:mod:`rltrain.agents.interaction`).

The text-environment protocol and tools are in :mod:`rltrain.tasks.text_env`, the text format of
a tool call in :mod:`rltrain.tasks.tool_format`, the built-in agent task in
:mod:`rltrain.tasks.calc_tool`.
"""
