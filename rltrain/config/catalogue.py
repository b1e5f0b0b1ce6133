"""The hardware catalogue that ``whatif.hardware`` and ``whatif.link`` name (``conf/whatif``).

One file per accelerator (``conf/whatif/devices/<name>.yaml``: memory, memory bandwidth, dense
BF16 peak, the link between the GPUs of a node, the host link, the source of the figures) and
one per link (``conf/whatif/links/<name>.yaml``: bandwidth each way, latency, source). Adding a
file adds an option. Read with OmegaConf (no Ray, no torch); the what-if simulator
(:mod:`rltrain.whatif.hardware`) turns the entries into records.
"""

from __future__ import annotations

import functools
import os
from typing import Any

from omegaconf import OmegaConf

from rltrain.errors import ConfigError

_HERE = os.path.dirname(os.path.abspath(__file__))


def conf_dir() -> str:
    """The ``conf`` directory: the checkout's top-level one, else the installed ``rltrain.conf``."""
    checkout = os.path.join(os.path.dirname(os.path.dirname(_HERE)), "conf")
    if os.path.isdir(os.path.join(checkout, "whatif")):
        return checkout
    installed = os.path.join(os.path.dirname(_HERE), "conf")
    return installed


@functools.lru_cache(maxsize=4)
def entries(kind: str) -> dict[str, dict[str, Any]]:
    """``devices`` or ``links``: name -> the entry's fields, from ``conf/whatif/<kind>/*.yaml``.

    Raises:
        ConfigError: an entry whose ``name`` differs from its file name.
    """
    folder = os.path.join(conf_dir(), "whatif", kind)
    out: dict[str, dict[str, Any]] = {}
    if not os.path.isdir(folder):
        return out
    for file in sorted(os.listdir(folder)):
        if not file.endswith(".yaml"):
            continue
        data = OmegaConf.to_container(OmegaConf.load(os.path.join(folder, file)), resolve=True)
        name = file[: -len(".yaml")]
        if not isinstance(data, dict) or data.get("name", name) != name:
            raise ConfigError(f"{folder}/{file}: its name field must be {name!r}")
        out[name] = data
    return out


def problems(hardware: str | None, link: str | None) -> list[str]:
    """Names outside the catalogue, each with the known ones (``whatif.hardware``/``link``)."""
    out = []
    for key, value, kind in (
        ("whatif.hardware", hardware, "devices"),
        ("whatif.link", link, "links"),
    ):
        known = entries(kind)
        if value is not None and str(value).lower() not in known:
            out.append(
                f"{key}={value!r} is not in the catalogue: choose one of {sorted(known)} (or add "
                f"conf/whatif/{kind}/{value}.yaml)"
            )
    return out
