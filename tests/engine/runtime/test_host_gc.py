"""The collector policy around the generation loop (engine/runtime/host_gc.py)."""

from __future__ import annotations

import gc

import pytest

from eaglelab.engine.runtime import host_gc
from eaglelab.engine.runtime.host_gc import HostGC


@pytest.fixture
def restore_gc():
    enabled = gc.isenabled()
    yield
    gc.unfreeze()
    (gc.enable if enabled else gc.disable)()


def test_the_policy_defaults_by_device_and_follows_the_environment(monkeypatch):
    monkeypatch.delenv("EAGLELAB_GC", raising=False)
    assert host_gc.policy("cuda") == "freeze" and host_gc.policy("cpu") == "as-is"
    monkeypatch.setenv("EAGLELAB_GC", "off")
    assert host_gc.policy("cpu") == "off"
    assert host_gc.policy("cuda", asked="as-is") == "as-is"
    monkeypatch.setenv("EAGLELAB_GC", "sometimes")
    with pytest.raises(ValueError, match="EAGLELAB_GC='sometimes'.*freeze, off, as-is"):
        host_gc.policy("cuda")


@pytest.mark.usefixtures("restore_gc")
def test_settling_collects_then_freezes_what_survives():
    gc.unfreeze()

    class Node:
        pass

    garbage = Node()
    garbage.me = garbage  # a reference cycle: only a collection frees it
    kept = [Node()]
    del garbage
    HostGC("freeze").settle()
    frozen = gc.get_freeze_count()
    assert frozen > 0 and kept[0] is not None
    assert not any(type(o) is Node and getattr(o, "me", None) is o for o in gc.get_objects())  # collected first
    HostGC("as-is").settle()
    assert gc.get_freeze_count() == frozen  # as-is touches nothing


@pytest.mark.usefixtures("restore_gc")
@pytest.mark.parametrize("name, inside", [("off", False), ("freeze", True), ("as-is", True)])
def test_only_off_stops_collection_during_the_loop_and_restores_it(name, inside):
    gc.enable()
    with HostGC(name).during_loop():
        assert gc.isenabled() is inside
    assert gc.isenabled()
    gc.disable()  # a caller that had it off keeps it off
    with HostGC(name).during_loop():
        assert not gc.isenabled()
    assert not gc.isenabled()


@pytest.mark.usefixtures("restore_gc")
def test_an_engine_takes_the_policy_of_its_environment(monkeypatch):
    from eaglelab.engine.runtime.generate import Engine
    from tests.conftest import random_model
    from tests.engine.runtime.test_speculative import CFG, PROMPTS

    target = random_model(CFG, seed=3)
    base = Engine(target).generate(PROMPTS, 6).tokens
    monkeypatch.setenv("EAGLELAB_GC", "off")
    engine = Engine(target)
    assert engine.gc.name == "off"
    assert engine.generate(PROMPTS, 6).tokens == base and gc.isenabled()
