"""The partition map a rescale switches to (``sfaas.runtime.partitioning.rebalance``)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sfaas.runtime.partitioning import default_owners, owned, rebalance


@st.composite
def maps(draw: st.DrawFn) -> tuple[list[int], int]:
    partitions = draw(st.integers(1, 64))
    old_n = draw(st.integers(1, partitions))
    owners = draw(st.lists(st.integers(0, old_n - 1), min_size=partitions, max_size=partitions))
    return owners, draw(st.integers(1, partitions))


@settings(max_examples=500, deadline=None)
@given(maps())
def test_rebalance_is_balanced_and_moves_the_fewest_partitions(case: tuple[list[int], int]) -> None:
    owners, n = case
    new = rebalance(owners, n)
    counts = [len(owned(new, i)) for i in range(n)]
    assert len(new) == len(owners) and all(0 <= o < n for o in new)
    assert max(counts) - min(counts) <= 1 and min(counts) >= 1, counts
    # the fewest moves: every worker keeps as many of its partitions as a balanced map lets
    # it, the ⌈P/n⌉ shares going to those that hold the most
    base, extra = divmod(len(owners), n)
    held = sorted((sum(1 for o in owners if o == i) for i in range(n)), reverse=True)
    can_keep = sum(min(h, base + (1 if r < extra else 0)) for r, h in enumerate(held))
    moved = sum(1 for a, b in zip(owners, new, strict=True) if a != b)
    assert moved == len(owners) - can_keep, (owners, n, new)


def test_two_three_two_moves_only_what_it_must() -> None:
    two = default_owners(8, 2)
    three = rebalance(two, 3)
    assert sum(a != b for a, b in zip(two, three, strict=True)) == 2 and sorted(map(three.count, range(3))) == [2, 3, 3]
    back = rebalance(three, 2)
    assert sum(a != b for a, b in zip(three, back, strict=True)) == 2 and back.count(0) == back.count(1) == 4


@pytest.mark.parametrize(("owners", "n"), [([0, 1], 3), ([0, 0], 0), ([], 1)])
def test_a_map_that_cannot_be_had_is_refused(owners: list[int], n: int) -> None:
    with pytest.raises(ValueError, match="workers"):
        rebalance(owners, n)
