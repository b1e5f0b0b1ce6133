"""Benchmark measures: every module here is imported by ``rltrain.bench.harness.discover``.

Add a module with a function decorated by ``@measure("name")`` returning a ``Suite``; import
heavy libraries (ray, torch) inside the function so that listing measures stays cheap.
"""
