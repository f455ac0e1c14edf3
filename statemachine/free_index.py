"""A best-fit index: for each chain level at or above the node, cells by their free GPU count.

Placement asks "which cells at this level have at least N free GPUs, fewest first, then lowest
id". Keeping, per (chain, level), one sorted id list per free count and a sorted list of the
counts present answers that without scanning 1,024 nodes; a move costs two bisections. Cells
with no free GPU are not listed. Iteration yields ids in (free count, id) order, so the answer
is the same on every replica and after every snapshot restore.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator


class FreeIndex:
    __slots__ = ("_buckets", "_counts")

    def __init__(self, levels: int) -> None:
        # _buckets[level][count] = sorted cell ids; _counts[level] = sorted counts present
        self._buckets: list[dict[int, list[int]]] = [{} for _ in range(levels + 1)]
        self._counts: list[list[int]] = [[] for _ in range(levels + 1)]

    def add(self, level: int, cell: int, count: int) -> None:
        if count <= 0:
            return
        bucket = self._buckets[level].get(count)
        if bucket is None:
            self._buckets[level][count] = [cell]
            bisect.insort(self._counts[level], count)
        else:
            bisect.insort(bucket, cell)

    def remove(self, level: int, cell: int, count: int) -> None:
        if count <= 0:
            return
        bucket = self._buckets[level][count]
        position = bisect.bisect_left(bucket, cell)
        assert position < len(bucket) and bucket[position] == cell, (level, cell, count)
        del bucket[position]
        if not bucket:
            del self._buckets[level][count]
            counts = self._counts[level]
            del counts[bisect.bisect_left(counts, count)]

    def move(self, level: int, cell: int, old: int, new: int) -> None:
        if old != new:
            self.remove(level, cell, old)
            self.add(level, cell, new)

    def at_least(self, level: int, count: int) -> Iterator[int]:
        """Cells at `level` with at least `count` free GPUs, by (free count, id)."""
        counts = self._counts[level]
        buckets = self._buckets[level]
        for position in range(bisect.bisect_left(counts, count), len(counts)):
            yield from buckets[counts[position]]

    def largest(self, level: int) -> int:
        """The most free GPUs any cell at `level` has (0 when none has any)."""
        counts = self._counts[level]
        return counts[-1] if counts else 0

    def contents(self) -> list[list[tuple[int, list[int]]]]:
        """Every level's (count, ids) pairs in order: for comparing with a recomputation."""
        return [[(count, list(buckets[count])) for count in counts]
                for buckets, counts in zip(self._buckets, self._counts, strict=True)]
