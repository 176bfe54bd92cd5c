"""SlotTable assignment rules, without a model."""

from __future__ import annotations

import pytest

from engine.scheduling.slots import SlotTable, common_prefix


def test_common_prefix():
    assert common_prefix([1, 2, 3], [1, 2, 4]) == 2
    assert common_prefix([], [1]) == 0
    assert common_prefix([5, 6], [5, 6, 7]) == 2


def test_pinned_slot_and_busy_pin_waits():
    table = SlotTable(3)
    choice = table.choose([1, 2], id_slot=2)
    assert choice.slot.id == 2
    table.take(choice.slot, id_task=7)
    assert table.choose([1, 2], id_slot=2) is None  # busy: the pinned request waits
    assert table.choose([1, 2]).slot.id != 2  # an unpinned one goes elsewhere
    with pytest.raises(ValueError):
        table.take(choice.slot, id_task=8)


def test_longest_prefix_above_threshold_else_lru():
    table = SlotTable(3, similarity=0.5)
    for slot, cached in zip(table.slots, [[1, 2, 3, 4], [1, 2, 9, 9], [7, 7]]):
        table.take(slot, 1)
        table.release(slot, cached)
    best = table.choose([1, 2, 3, 4, 5])
    assert best.slot.id == 0 and best.n_reuse == 4  # 4/5 > 0.5
    weak = table.choose([1, 8, 8, 8, 8])  # 1/5 shares too little: least recently used
    assert weak.slot.id == 0 and weak.n_reuse == 1
    table.take(table.slots[0], 2)
    table.release(table.slots[0], [1, 2, 3, 4])  # slot 0 is now the most recently used
    assert table.choose([9, 9, 9]).slot.id == 1


def test_all_busy_means_wait():
    table = SlotTable(2)
    for slot in table.slots:
        table.take(slot, 1)
    assert table.choose([1]) is None and table.idle == []
