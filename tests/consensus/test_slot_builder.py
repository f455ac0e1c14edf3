"""slot_builder: the object it builds is the one the constructor makes (equal, same hash and
repr, still frozen), and it refuses classes whose constructor does more than store fields."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import pytest
from hypothesis import given
from hypothesis import strategies as st

from consensus.slot_builder import slot_builder


@dataclass(frozen=True, slots=True)
class Sample:
    number: int
    text: str
    blob: bytes = b""


@dataclass(frozen=True, slots=True)
class Checked:
    number: int

    def __post_init__(self) -> None:
        if self.number < 0:
            raise ValueError("negative")


@dataclass(frozen=True, slots=True)
class Derived:
    number: int
    double: int = field(init=False)


@dataclass(frozen=True)
class Unslotted:
    number: int


build_sample = slot_builder(Sample)


@given(st.integers(), st.text(), st.binary())
def test_built_equals_constructed(number: int, text: str, blob: bytes) -> None:
    built, made = build_sample(number, text, blob), Sample(number, text, blob)
    assert built == made and hash(built) == hash(made) and repr(built) == repr(made)
    assert type(built) is Sample


def test_built_objects_stay_frozen() -> None:
    built = build_sample(1, "a", b"")
    with pytest.raises(dataclasses.FrozenInstanceError):
        built.number = 2  # type: ignore[misc]


def test_every_field_is_required_defaults_included() -> None:
    with pytest.raises(TypeError):
        build_sample(1, "a")


@pytest.mark.parametrize("cls", [Checked, Derived, Unslotted, int])
def test_classes_whose_constructor_does_more_are_refused(cls: type) -> None:
    with pytest.raises(TypeError):
        slot_builder(cls)
