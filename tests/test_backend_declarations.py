"""Each backend declares what it runs and needs (``BACKEND`` in its module); the config
validates and sizes a buffer from that declaration alone. CPU only."""
from __future__ import annotations

import subprocess
import sys
import types

import pytest

from symmoe import config
from symmoe.backends import BACKENDS, MODULES, BackendSpec
from symmoe.errors import ConfigError


@pytest.mark.parametrize("name", list(MODULES))
def test_every_registered_backend_declares_itself(name):
    spec = BACKENDS[name]
    assert isinstance(spec, BackendSpec) and spec.name == name
    assert spec.protocols and set(spec.protocols) <= {"push", "pull"}
    assert spec.load().name == name  # its SymmetricMemory class, named as in YAML


def test_declarations_are_read_without_any_backend_library():
    code = ("import sys, symmoe.backends as b; [b.declared(n) for n in b.MODULES]; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('nvshmem', 'nccl')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


@pytest.fixture
def fake_backend(monkeypatch):
    """A backend the config has never heard of, registered with its declaration alone."""
    mod = types.ModuleType("symmoe.backends.fake_for_test")
    mod.BACKEND = BackendSpec("fake", "FakeMemory", protocols=("pull", "push"), modelled_on="nothing",
                              pull_in_place=False, channel_rings=True)
    monkeypatch.setitem(sys.modules, mod.__name__, mod)
    monkeypatch.setitem(MODULES, "fake", "fake_for_test")
    monkeypatch.setitem(config._CHOICES, "backend", tuple(MODULES))
    return mod.BACKEND


def test_the_config_follows_a_backend_s_declaration(fake_backend):
    cfg = config.from_dict({"backend": "fake", "kernel": {"num_channels": 4}, "buffer": {"max_tokens_per_rank": 100}})
    assert cfg.effective_protocol == "pull"  # its native protocol: the first it declares
    assert cfg.pool_limit(2) == 2 * (100 + 4)  # its pull copies into rings, a row of slack per ring
    assert cfg.layout(2).num_channels == 4
    push = config.from_dict({"backend": "fake", "protocol": "push"})
    assert push.effective_protocol == "push"


def test_a_protocol_the_backend_does_not_declare_is_refused_naming_what_it_runs(monkeypatch, fake_backend):
    only_push = BackendSpec("fake", "FakeMemory", protocols=("push",), modelled_on="nothing")
    monkeypatch.setattr(sys.modules["symmoe.backends.fake_for_test"], "BACKEND", only_push)
    with pytest.raises(ConfigError, match=r"protocol = 'pull': backend 'fake' runs: push"):
        config.from_dict({"backend": "fake", "protocol": "pull"})
