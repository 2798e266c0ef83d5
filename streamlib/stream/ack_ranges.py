"""A durable cursor's acknowledgement state: a mark-delete position (everything at or
before it is acknowledged) plus individually acknowledged ranges above it.

As in Pulsar, a range is (lower, upper]: lower exclusive, upper inclusive. A message is
acknowledged as the range (its predecessor, itself], where the predecessor is the
message delivered just before it, so adjacent acknowledgements join without gaps and
the mark-delete position advances exactly when everything up to a point is acked.
"""

from __future__ import annotations

from sortedcontainers import SortedList

from streamlib.stream.positions import MessageId


class AckRanges:
    def __init__(
        self, mark_delete: MessageId, ranges: list[tuple[MessageId, MessageId]] | None = None
    ) -> None:
        self.mark_delete = mark_delete
        self._ranges: SortedList = SortedList()
        for lower, upper in ranges or []:
            self.ack_range(lower, upper)

    @property
    def range_count(self) -> int:
        return len(self._ranges)

    @property
    def ranges(self) -> list[tuple[MessageId, MessageId]]:
        return list(self._ranges)

    def has_ranges(self) -> bool:
        """Whether anything above the mark-delete position is acknowledged."""
        return bool(self._ranges)

    def is_acked(self, position: MessageId) -> bool:
        if position <= self.mark_delete:
            return True
        if not self._ranges:
            return False
        i = self._ranges.bisect_left((position, position))
        # The only range that can hold position starts before it.
        for candidate in self._ranges[max(0, i - 1) : i + 1]:
            lower, upper = candidate
            if lower < position <= upper:
                return True
        return False

    def ack(self, previous: MessageId, position: MessageId) -> None:
        """Acknowledge one message, delivered right after `previous`."""
        self.ack_range(previous, position)

    def ack_range(self, lower: MessageId, upper: MessageId) -> None:
        if upper <= self.mark_delete:
            return
        if lower <= self.mark_delete and (not self._ranges or self._ranges[0][0] > upper):
            self.mark_delete = upper  # in order: nothing to merge (the common case)
            return
        lower = max(lower, self.mark_delete)
        # Merge with every range that overlaps or touches (lower, upper].
        i = self._ranges.bisect_left((lower, lower))
        if i > 0 and self._ranges[i - 1][1] >= lower:
            i -= 1
        while i < len(self._ranges) and self._ranges[i][0] <= upper:
            other_lower, other_upper = self._ranges.pop(i)
            lower, upper = min(lower, other_lower), max(upper, other_upper)
        self._ranges.add((lower, upper))
        self._advance()

    def ack_cumulative(self, position: MessageId) -> None:
        """Everything up to and including position is acknowledged."""
        if position > self.mark_delete:
            self.mark_delete = position
            while self._ranges and self._ranges[0][1] <= self.mark_delete:
                self._ranges.pop(0)
            self._advance()

    def _advance(self) -> None:
        while self._ranges and self._ranges[0][0] <= self.mark_delete:
            _, upper = self._ranges.pop(0)
            self.mark_delete = max(self.mark_delete, upper)

    def reset(self, mark_delete: MessageId) -> None:
        self.mark_delete = mark_delete
        self._ranges.clear()
