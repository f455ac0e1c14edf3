"""The busy processes' collector settings hold inside the block and are undone after it."""

from __future__ import annotations

import gc

import pytest

from cellar.gc_tuning import GC_THRESHOLDS, quiet_garbage_collector


def test_the_collector_is_quiet_inside_and_restored_after() -> None:
    before = gc.get_threshold()
    frozen_before = gc.get_freeze_count()
    with quiet_garbage_collector():
        assert gc.get_threshold() == GC_THRESHOLDS
        assert gc.get_freeze_count() > frozen_before  # what was alive is out of sight
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0


def test_the_settings_are_restored_when_the_block_fails() -> None:
    before = gc.get_threshold()
    with pytest.raises(RuntimeError), quiet_garbage_collector():
        raise RuntimeError("the work failed")
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0
