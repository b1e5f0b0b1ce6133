"""Packaging glue that pyproject.toml cannot express: the top-level ``conf/`` directory ships
inside the wheel as the package ``rltrain.conf`` (found by Hydra as ``pkg://rltrain.conf``);
the benchmarks (``rltrain.bench``: harness, measures, the plain GRPO script) are not runtime
code and stay in the source tree (``python -m rltrain.bench`` runs from a checkout)."""

from setuptools import find_namespace_packages, find_packages, setup

setup(
    packages=[
        *find_packages(include=["rltrain", "rltrain.*"], exclude=["rltrain.bench*"]),
        *find_namespace_packages(include=["hydra_plugins.*"]),
        "rltrain.conf",
    ],
    package_dir={"rltrain.conf": "conf"},
    package_data={"rltrain.conf": ["*.yaml", "*/*.yaml", "*/*/*.yaml"], "rltrain": ["py.typed"]},
)
