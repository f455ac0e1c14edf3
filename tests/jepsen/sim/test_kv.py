"""The simulator's key-value store: commands, its remembered cas outcomes, and snapshots."""

from __future__ import annotations

import pytest

from consensus.codec import pack
from consensus.errors import InvalidMessage
from jepsen.sim.kv import CAS_OUTCOMES_MAX, KvStateMachine
from jepsen.sim.kv_codec import decode_reply, encode_cas, encode_put


def test_cas_takes_effect_only_on_the_expected_value() -> None:
    store = KvStateMachine()
    assert decode_reply(store.apply(encode_put("k", 1))) == (True, 1)
    assert decode_reply(store.apply(encode_cas("k", 2, 3))) == (False, 1)
    assert decode_reply(store.apply(encode_cas("k", 1, 4))) == (True, 4)
    assert store.cas_outcomes == {3: False, 4: True}


def test_a_restored_store_knows_the_cas_outcomes_of_the_one_it_came_from() -> None:
    store = KvStateMachine()
    store.apply(encode_put("k", 1))
    store.apply(encode_cas("k", 1, 2))
    store.apply(encode_cas("k", 1, 3))
    restored = KvStateMachine()
    restored.restore(store.snapshot())
    assert restored.data == {"k": 2}
    assert restored.cas_outcomes == {2: True, 3: False}
    assert restored.digest() == store.digest()


def test_only_the_newest_cas_outcomes_are_kept() -> None:
    store = KvStateMachine()
    for value in range(1, CAS_OUTCOMES_MAX + 11):
        store.apply(encode_cas("k", None, value))  # only the first takes effect
    assert len(store.cas_outcomes) == CAS_OUTCOMES_MAX
    assert 10 not in store.cas_outcomes and 11 in store.cas_outcomes
    assert list(store.cas_outcomes)[-1] == CAS_OUTCOMES_MAX + 10
    restored = KvStateMachine()
    restored.restore(store.snapshot())
    assert restored.cas_outcomes == store.cas_outcomes


@pytest.mark.parametrize("snapshot", [
    pack([[["k", 1]]]),  # no outcomes part
    pack([[["k", 1]], [[5, "yes"]]]),  # an outcome that is not a bool
    pack([[["k"]], []]),  # a pair with one field
    pack([[], [[value, True] for value in range(CAS_OUTCOMES_MAX + 1)]]),  # too many outcomes
])
def test_a_malformed_snapshot_is_refused(snapshot: bytes) -> None:
    with pytest.raises(InvalidMessage):
        KvStateMachine().restore(snapshot)
