"""A user's module (a reward function, an environment class) that raises while it is imported
is refused with the key and the error, as a module that is not found is: never a traceback."""

from __future__ import annotations

import sys

import pytest

from rltrain.config.validate import _importable
from rltrain.errors import ConfigError
from rltrain.tasks.base import import_reward_fn
from rltrain.tasks.text_env import load_env_class

BROKEN = {
    "rltrain_test_syntax": ("def f(prompt, response, answer:\n", "SyntaxError"),
    "rltrain_test_raises": (
        'raise RuntimeError("boom at import")\n',
        r"RuntimeError at .*rltrain_test_raises.py:1: boom",
    ),
}


@pytest.fixture
def broken_modules(tmp_path, monkeypatch):
    for name, (source, _) in BROKEN.items():
        (tmp_path / f"{name}.py").write_text(source)
        monkeypatch.delitem(sys.modules, name, raising=False)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield
    for name in BROKEN:
        sys.modules.pop(name, None)


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_a_module_raising_on_import_is_refused_with_the_key(broken_modules, name):
    spec, what = f"{name}:f", BROKEN[name][1]
    want = rf"task.reward_fn='{name}:f': importing module '{name}' raised {what}"
    (problem,) = _importable("task.reward_fn", spec)
    assert problem.startswith(f"task.reward_fn='{name}:f': importing module '{name}' raised")
    with pytest.raises(ConfigError, match=want):
        import_reward_fn(spec, "task.reward_fn")
    with pytest.raises(ConfigError, match=rf"task.env='{name}:Env': importing module"):
        load_env_class(f"{name}:Env", "task.env")
