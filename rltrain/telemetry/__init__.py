"""Telemetry: metrics sinks, progress display, and the per-device timeline trace.

Import-light: import the submodule you need (``from rltrain.telemetry.trace import span``).
"""
