"""fast_init: the same objects as the dataclass's own __init__, for every class that uses it."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import pkgutil
from dataclasses import dataclass, field
from typing import Any

import lagwatch
import pytest
from lagwatch.estimate.snapshot import NodeObservation
from lagwatch.fastinit import fast_init


@fast_init
@dataclass(frozen=True)
class Sample:
    a: int
    b: str = "b"
    c: dict[str, int] = field(default_factory=dict)


def made_by_dataclass(cls: type[Any], *args: Any, **kwargs: Any) -> Any:
    """An instance made by the dataclass's own generated __init__ (kept as __wrapped__)."""
    obj = object.__new__(cls)
    cls.__init__.__wrapped__(obj, *args, **kwargs)
    return obj


def test_defaults_factories_positional_and_keyword_arguments_as_the_dataclass_has_them() -> None:
    for args, kwargs in [((1,), {}), ((1, "x"), {}), ((1,), {"c": {"k": 2}}), ((), {"a": 3, "b": "y"})]:
        ours, theirs = Sample(*args, **kwargs), made_by_dataclass(Sample, *args, **kwargs)
        assert ours == theirs and vars(ours) == vars(theirs)
    assert Sample(1).c is not Sample(1).c  # a fresh factory value each time
    given: dict[str, int] = {}
    assert Sample(1, c=given).c is given


def test_still_frozen_hashable_and_a_dataclass() -> None:
    sample = Sample(1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        sample.a = 2  # type: ignore[misc]
    assert dataclasses.replace(sample, a=5) == Sample(5)
    assert dataclasses.asdict(sample) == {"a": 1, "b": "b", "c": {}}
    assert repr(sample) == "Sample(a=1, b='b', c={})"


def test_wrong_calls_fail_as_they_would_without_it() -> None:
    for args, kwargs in [((), {}), ((1, "x", {}, 4), {}), ((1,), {"d": 1}), ((1,), {"a": 1})]:
        with pytest.raises(TypeError):
            Sample(*args, **kwargs)
        with pytest.raises(TypeError):
            made_by_dataclass(Sample, *args, **kwargs)


def test_what_it_cannot_do_is_refused_when_the_class_is_made() -> None:
    @dataclass
    class Unfrozen:
        a: int

    @dataclass(frozen=True)
    class PostInit:
        a: int

        def __post_init__(self) -> None:
            pass

    @dataclass(frozen=True)
    class NotInInit:
        a: int = field(default=0, init=False)

    @dataclass(frozen=True, kw_only=True)
    class KeywordOnly:
        a: int

    for cls in (Unfrozen, PostInit, NotInInit, KeywordOnly):
        with pytest.raises(TypeError, match="fast_init"):
            fast_init(cls)


def lagwatch_classes_with_fast_init() -> list[type[Any]]:
    found = []
    for module in pkgutil.walk_packages(lagwatch.__path__, "lagwatch."):
        for _, cls in inspect.getmembers(importlib.import_module(module.name), inspect.isclass):
            init = cls.__dict__.get("__init__")
            if cls.__module__ == module.name and getattr(init, "__wrapped__", None) is not None \
                    and dataclasses.is_dataclass(cls):
                found.append(cls)
    return found


def test_every_lagwatch_class_with_it_builds_what_its_dataclass_init_builds() -> None:
    classes = lagwatch_classes_with_fast_init()
    assert {"NodeObservation", "ReplicaState", "ServerPosition", "WalSender"} <= {c.__name__ for c in classes}
    for cls in classes:
        theirs = inspect.signature(cls.__init__.__wrapped__)
        ours = inspect.signature(cls.__init__, follow_wrapped=False)
        assert [(p.name, p.kind) for p in ours.parameters.values()] == \
               [(p.name, p.kind) for p in theirs.parameters.values()], cls
        fields = dataclasses.fields(cls)
        # Every field given a distinct value; then only those without a default.
        everything = {f.name: object() for f in fields}
        required = {f.name: everything[f.name] for f in fields
                    if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}
        for kwargs in (everything, required):
            assert vars(cls(**kwargs)) == vars(made_by_dataclass(cls, **kwargs)), cls


def test_a_polled_observation_is_the_answer_with_the_polls_facts() -> None:
    """NodeObservation.polled copies the fields as fast_init fills them: equal to one made
    with every field, the answer it came from unchanged, and as frozen."""
    answer = NodeObservation(cluster="c", node="r1", role="replica", observed_at=1.0, duration=0.0, answered_at=1.0,
                             views={"server": True})
    polled = answer.polled(observed_at=2.0, duration=0.5, asked_at=1.5, wal_dating=None, wal_clock=((9.0, 1.9),),
                           view_errors_total={"wal": 1}, connects_total=3)
    assert polled == NodeObservation(cluster="c", node="r1", role="replica", observed_at=2.0, duration=0.5,
                                     asked_at=1.5, answered_at=1.0, views={"server": True}, wal_clock=((9.0, 1.9),),
                                     view_errors_total={"wal": 1}, connects_total=3)
    assert (answer.observed_at, answer.connects_total, answer.wal_clock) == (1.0, 0, ())
    with pytest.raises(dataclasses.FrozenInstanceError):
        polled.duration = 1.0  # type: ignore[misc]
