"""`client.streams`: create, list, stats, delete, reset cursors, trim (retention),
compact, and the sweeper of leaked ledgers. The retention rules themselves are
streamlib.protocol.stream_rules.retention_plan (ledgers) and fragment_retention_plan
(the fragments of an unbounded stream's one ledger); compaction's are
streamlib.protocol.compaction, its I/O streamlib.stream.compaction.

(Over 600 lines: it is the one facade of a stream's administration, as pulsar-admin's
topics command; each part is a thin layer over a module of its own.)"""

from __future__ import annotations

import builtins
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

from metadata.errors import BadVersionError, NodeExistsError, StreamExistsError
from metadata.errors import NoSuchStreamError as MetadataNoSuchStream
from metadata.schemas import (
    CursorState,
    LedgerConfig,
    StreamMetadata,
    StreamMode,
)
from metadata.schemas import RetentionPolicy as RetentionPb
from metadata.schemas import RolloverPolicy as RolloverPb
from metadata.services.streams import StreamRegistry
from streamlib.ledger.manager import LedgerManager
from streamlib.protocol.compaction import (
    backlog_bytes,
    entry_in,
    fragment_retention_marks,
    retention_marks,
)
from streamlib.protocol.errors import (
    BadRequestError,
    ConsumerBusyError,
    NoSuchLedgerError,
    NoSuchStreamError,
    NoSuchSubscriptionError,
)
from streamlib.protocol.ledger_metadata import LedgerMetadata
from streamlib.protocol.quorum import validate_quorums
from streamlib.protocol.stream_rules import (
    FragmentSpan,
    LedgerSpan,
    RetentionPolicy,
    RolloverPolicy,
    fragment_retention_plan,
    retention_plan,
)
from streamlib.retry import retry_cas
from streamlib.stream import snapshots
from streamlib.stream.ack_ranges import AckRanges
from streamlib.stream.compacted import view_of
from streamlib.stream.compaction import (
    COMPACTED_VIEW_OF,
    CompactionResult,
    Compactor,
    compacting_ledger,
)
from streamlib.stream.durable import position_from_pb, ranges_from_state, ranges_to_state
from streamlib.stream.positions import (
    EARLIEST,
    LATEST,
    MessageId,
    describe,
    parse_start,
    position_before,
)
from streamlib.stream.reader import Message, StreamScanner
from streamlib.stream.subscription import describe_contender
from streamlib.stream.writer import STREAM_PASSWORD, now_ms

log = logging.getLogger(__name__)


def _policy(value: Any, cls: type) -> Any:
    if value is None:
        return cls()
    if isinstance(value, Mapping):
        try:
            value = cls(**value)
        except TypeError as error:
            raise BadRequestError(f"bad {cls.__name__}: {error}") from None
    if not isinstance(value, cls):
        raise BadRequestError(f"expected a {cls.__name__} or a dict, got {value!r}")
    for name, given in vars(value).items():  # (ints >= 0; the compacted flag a bool)
        wanted = bool if name == "compacted" else int
        if type(given) is not wanted or (wanted is int and given < 0):
            raise BadRequestError(
                f"bad {cls.__name__}: {name} must be "
                f"{'True or False' if wanted is bool else 'an int >= 0'}, got {given!r}"
            )
    return value


DEFAULT_ENSEMBLE, DEFAULT_WRITE_QUORUM, DEFAULT_ACK_QUORUM = 3, 2, 2
PARTITIONS = "partitions"  # the property of a partitioned stream's record
MAX_PARTITIONS = 1024


def _check_threshold(threshold_bytes: object) -> None:
    if not isinstance(threshold_bytes, int) or isinstance(threshold_bytes, bool):
        raise BadRequestError(f"a compaction threshold is bytes (an int), got {threshold_bytes!r}")
    if threshold_bytes < 0:
        raise BadRequestError(f"a compaction threshold is >= 0 bytes, got {threshold_bytes}")


def partitions_of(md: StreamMetadata) -> int:
    """How many partitions a stream's record names (0: it is not partitioned)."""
    return int(md.properties.get(PARTITIONS, "0"))


def partition_name(name: str, index: int) -> str:
    """The stream holding one partition of a partitioned stream (Pulsar's naming)."""
    return f"{name}-partition-{index}"


def _fields(stored: Any, cls: type) -> dict[str, Any]:
    """A stored policy message as the keyword arguments of its dataclass."""
    return {f.name: getattr(stored, f.name) for f in fields(cls)}


@dataclass(frozen=True)
class SubscriptionStats:
    mark_delete: str  # positions.describe: "earliest", "LEDGER:ENTRY[:INDEX]"
    backlog_entries: int
    backlog_messages: int | None  # None: more than BACKLOG_COUNT_LIMIT (not counted on)
    consumers: list[str]  # the connected consumers, the active one first ("type name")


# Counting a backlog in messages reads its entries: at most this many messages.
BACKLOG_COUNT_LIMIT = 100_000


class StreamManager:
    def __init__(self, registry: StreamRegistry, ledgers: LedgerManager) -> None:
        self.registry = registry
        self._ledgers = ledgers

    async def read(self, name: str) -> tuple[StreamMetadata, int]:
        try:
            return await self.registry.read(name)
        except MetadataNoSuchStream:
            raise NoSuchStreamError(f"stream {name!r} does not exist") from None

    async def defaults(self) -> StreamMetadata:
        """What a stream created without them gets: the cluster's defaults (set with
        set_defaults; `streamlib sandbox` sets them from its --bookies), else
        E3/Qw2/Qa2, no rollover limits but the built-in ones, no retention limit."""
        stored = await self.registry.read_defaults()
        if stored is not None:
            return stored
        return StreamMetadata(
            ledger_config=LedgerConfig(
                ensemble_size=DEFAULT_ENSEMBLE,
                write_quorum=DEFAULT_WRITE_QUORUM,
                ack_quorum=DEFAULT_ACK_QUORUM,
            ),
            rollover=RolloverPb(**asdict(RolloverPolicy())),
            retention=RetentionPb(**asdict(RetentionPolicy())),
        )

    async def set_defaults(
        self,
        ensemble: int | None = None,
        write_quorum: int | None = None,
        ack_quorum: int | None = None,
        rollover: RolloverPolicy | Mapping[str, int] | None = None,
        retention: RetentionPolicy | Mapping[str, int] | None = None,
    ) -> StreamMetadata:
        """Change the cluster's defaults for new streams (what is not given stays)."""
        current = await self.defaults()
        config = current.ledger_config
        e = config.ensemble_size if ensemble is None else ensemble
        w = config.write_quorum if write_quorum is None else write_quorum
        a = config.ack_quorum if ack_quorum is None else ack_quorum
        validate_quorums(e, w, a)
        md = StreamMetadata(
            ledger_config=LedgerConfig(ensemble_size=e, write_quorum=w, ack_quorum=a),
            rollover=RolloverPb(**asdict(_policy(rollover, RolloverPolicy)))
            if rollover is not None
            else current.rollover,
            retention=RetentionPb(**asdict(_policy(retention, RetentionPolicy)))
            if retention is not None
            else current.retention,
        )
        await self.registry.write_defaults(md)
        return md

    async def create(
        self,
        name: str,
        ensemble: int | None = None,
        write_quorum: int | None = None,
        ack_quorum: int | None = None,
        rollover: RolloverPolicy | Mapping[str, int] | None = None,
        retention: RetentionPolicy | Mapping[str, int] | None = None,
        *,
        mode: str = "managed",
        properties: Mapping[str, str] | None = None,
        partitions: int = 0,
        compaction_threshold_bytes: int = 0,
    ) -> StreamMetadata:
        """Create a stream. What is not given comes from the cluster's defaults
        (defaults()). rollover: max_entries / max_bytes / max_age_ms; retention:
        time_ms / size_bytes (0 = unlimited; see stream_rules for the exact rule), and
        compacted (True: what the compaction horizon passed goes, whatever its age).
        compaction_threshold_bytes: the elected auditor compacts the stream when its
        rolled ledgers past the horizon hold more (0: only `compact()` does).
        Schema properties (schema.type, schema.definition) must be a schema a stream may
        keep (streamlib.schema.validate_definition), or InvalidSchemaError."""
        if properties:
            from streamlib.schema import validate_schema_properties

            validate_schema_properties(properties)
        base = await self.defaults()
        config = base.ledger_config
        ensemble = config.ensemble_size if ensemble is None else ensemble
        write_quorum = config.write_quorum if write_quorum is None else write_quorum
        ack_quorum = config.ack_quorum if ack_quorum is None else ack_quorum
        validate_quorums(ensemble, write_quorum, ack_quorum)
        roll = _policy(
            rollover if rollover is not None else _fields(base.rollover, RolloverPolicy),
            RolloverPolicy,
        )
        keep = _policy(
            retention if retention is not None else _fields(base.retention, RetentionPolicy),
            RetentionPolicy,
        )
        _check_threshold(compaction_threshold_bytes)
        modes = {"managed": StreamMode.MANAGED, "unbounded": StreamMode.UNBOUNDED}
        if mode not in modes:
            raise BadRequestError(f"mode is 'managed' or 'unbounded', got {mode!r}")
        md = StreamMetadata(
            name=name,
            mode=modes[mode],
            ledger_config=LedgerConfig(
                ensemble_size=ensemble, write_quorum=write_quorum, ack_quorum=ack_quorum
            ),
            rollover=RolloverPb(**asdict(roll)),
            retention=RetentionPb(**asdict(keep)),
            properties=dict(properties or {}),
            created_time_ms=now_ms(),
            compaction_threshold_bytes=compaction_threshold_bytes,
        )
        if partitions:
            # Pulsar's partitioned topic: streams NAME-partition-0..N-1 with these
            # policies, and NAME itself a record of how many (never written to).
            if not isinstance(partitions, int) or partitions < 1 or partitions > MAX_PARTITIONS:
                raise BadRequestError(f"partitions is 1..{MAX_PARTITIONS}, got {partitions!r}")
            for index in range(partitions):
                part = StreamMetadata()
                part.CopyFrom(md)
                part.name = partition_name(name, index)
                try:
                    await self.registry.create(part)
                except StreamExistsError:
                    pass  # (an earlier attempt made it: the record below is what counts)
            md.properties[PARTITIONS] = str(partitions)
        await self.registry.create(md)
        return md

    async def partitions(self, name: str) -> int:
        """How many partitions the stream has (0: it is not partitioned)."""
        return partitions_of((await self.read(name))[0])

    async def use_schema(self, name: str, schema: Any) -> None:
        """Check a producer's schema against the stream's (streamlib.schema); the first
        one (or a compatible change) is stored, by CAS of the stream's metadata."""
        from streamlib.schema import check_against

        async def attempt() -> None:
            md, version = await self.read(name)
            updates = check_against(schema, dict(md.properties))
            if updates:
                md.properties.update(updates)
                await self.registry.write(name, md, version)

        await retry_cas(f"stream {name!r}: schema", attempt)

    async def offer_schema(
        self, name: str, type_name: str, definition: str, checked: tuple[str, str]
    ) -> dict[str, str] | None:
        """The stream service's schema rule (the broker cannot decode a schema: its
        client checks compatibility). None when the stream now has (type_name,
        definition): it had none, had it, or had `checked` -- the (type, definition) the
        client found it compatible with -- and now has it; otherwise the stored one
        ({SCHEMA_TYPE: ..., SCHEMA_DEFINITION: ...}) for the client to check.
        InvalidSchemaError, before anything is read or stored, for a definition no
        stream may keep (the broker cannot judge compatibility, but it can judge that)."""
        from streamlib.schema import SCHEMA_DEFINITION, SCHEMA_TYPE, validate_definition

        validate_definition(type_name, definition)

        async def attempt() -> dict[str, str] | None:
            md, version = await self.read(name)
            stored = (md.properties.get(SCHEMA_TYPE), md.properties.get(SCHEMA_DEFINITION, ""))
            if stored == (type_name, definition):
                return None
            if stored[0] is not None and stored != checked:
                return {SCHEMA_TYPE: stored[0], SCHEMA_DEFINITION: stored[1]}
            md.properties[SCHEMA_TYPE] = type_name
            md.properties[SCHEMA_DEFINITION] = definition
            await self.registry.write(name, md, version)
            return None

        return await retry_cas(f"stream {name!r}: schema", attempt)

    async def set_policies(
        self,
        name: str,
        *,
        retention: RetentionPolicy | Mapping[str, Any] | None = None,
        compaction_threshold_bytes: int | None = None,
    ) -> StreamMetadata:
        """Change an existing stream's retention and compaction threshold (what is not
        given stays), by CAS of its metadata -- a partitioned stream's partitions' too;
        the stream's metadata after."""
        keep = None if retention is None else _policy(retention, RetentionPolicy)
        if compaction_threshold_bytes is not None:
            _check_threshold(compaction_threshold_bytes)
        for index in range(await self.partitions(name)):
            await self.set_policies(
                partition_name(name, index),
                retention=keep,
                compaction_threshold_bytes=compaction_threshold_bytes,
            )

        async def attempt() -> StreamMetadata:
            md, version = await self.read(name)
            if keep is not None:
                md.retention.CopyFrom(RetentionPb(**asdict(keep)))
            if compaction_threshold_bytes is not None:
                md.compaction_threshold_bytes = compaction_threshold_bytes
            await self.registry.write(name, md, version)
            return md

        return await retry_cas(f"stream {name!r}: policies", attempt)

    async def compact(
        self, name: str, *, on_step: Callable[[str], object] | None = None
    ) -> CompactionResult:
        """Compact the stream now (streamlib/stream/compaction.py): its compacted view
        then holds the latest message of every key up to the end confirmed now.
        CompactionSupersededError if another compactor's view was installed meanwhile;
        BadRequestError for a partitioned stream (compact each partition)."""
        if count := await self.partitions(name):
            raise BadRequestError(
                f"stream {name!r} is partitioned: compact each of its {count} partitions "
                f"({partition_name(name, 0)}, ...)"
            )
        return await Compactor(self._ledgers, self.registry).compact(name, on_step=on_step)

    async def compaction_backlog(self, name: str) -> int:
        """The bytes the compaction threshold is held against (compaction.backlog_bytes)."""
        md, _ = await self.read(name)
        view = view_of(md)
        ledgers = [(i.ledger_id, i.size_bytes) for i in md.ledgers]
        return backlog_bytes(ledgers, None if view is None else view.horizon)

    async def ensure(self, name: str) -> StreamMetadata:
        """The stream's metadata, creating the stream with the defaults first if it does
        not exist (a producer's first send)."""
        try:
            return (await self.read(name))[0]
        except NoSuchStreamError:
            pass
        try:
            return await self.create(name)
        except StreamExistsError:  # (another producer made it meanwhile)
            return (await self.read(name))[0]

    async def list(self) -> list[str]:
        return await self.registry.list()

    async def delete(self, name: str) -> None:
        """Delete the stream and its cursors, then its ledgers (a crash in between
        leaks ledgers for the sweeper; it never leaves a stream without its data)."""
        md, version = await self.read(name)
        await self.registry.delete(name, version)
        for index in range(partitions_of(md)):
            try:
                await self.delete(partition_name(name, index))
            except NoSuchStreamError:
                pass
        view = view_of(md)
        for ledger_id in [i.ledger_id for i in md.ledgers] + ([view.ledger_id] if view else []):
            try:
                await self._ledgers.delete(ledger_id)
            except NoSuchLedgerError:
                pass

    # -- cursors ------------------------------------------------------------------------

    async def cursor_states(self, name: str) -> dict[str, AckRanges]:
        """Each subscription's cursor: its mark-delete position and the ranges
        acknowledged above it."""
        await self.read(name)
        return {sub: ranges_from_state(state) for sub, state in (await self._states(name)).items()}

    async def _states(self, name: str) -> dict[str, CursorState]:
        """Each subscription's cursor as stored."""
        found = {}
        for sub in await self.registry.list_cursors(name):
            stored = await self.registry.read_cursor(name, sub)
            if stored is not None:
                found[sub] = stored[0]
        return found

    async def _unacknowledged(self, name: str, acks: AckRanges) -> AsyncIterator[Message]:
        """The messages confirmed now that the cursor has not acknowledged, in order."""
        scanner = StreamScanner(self._ledgers, self.registry, name, acks.mark_delete, tail=False)
        async for message in scanner.messages():
            if not acks.is_acked(message.message_id):
                yield message

    async def _cursor(self, name: str, subscription: str) -> tuple[AckRanges, int]:
        """A subscription's cursor and its version; NoSuchSubscriptionError if none."""
        state, version = await self._stored_cursor(name, subscription)
        return ranges_from_state(state), version

    async def _stored_cursor(self, name: str, subscription: str) -> tuple[CursorState, int]:
        stored = await self.registry.read_cursor(name, subscription)
        if stored is None:  # a typo must not create a subscription that pins retention
            raise NoSuchSubscriptionError(
                f"stream {name!r} has no subscription {subscription!r} (subscribe to create one)"
            )
        return stored

    async def backlog_messages(self, name: str, acks: AckRanges) -> int | None:
        """The messages confirmed now that the cursor has not acknowledged (None when
        more than BACKLOG_COUNT_LIMIT: counting reads them)."""
        count = 0
        async for _ in self._unacknowledged(name, acks):
            count += 1
            if count > BACKLOG_COUNT_LIMIT:
                return None
        return count

    async def consumers(self, name: str, subscription: str) -> builtins.list[str]:
        """The consumers connected to a subscription, the active one first, as
        "TYPE NAME" (streamlib/stream/subscription.py)."""
        lock = self.registry.store.lock(self.registry.subscribers_path(name, subscription), "")
        found = []
        for raw in await lock.contenders():
            described = describe_contender(raw)
            found.append(f"{described.get('type', '?')} {described.get('name', '?')}")
        return found

    async def skip(self, name: str, subscription: str, count: int) -> MessageId:
        """Acknowledge the next `count` messages of the subscription (as a consumer
        would, by CAS of its cursor); the new mark-delete position."""
        if count < 1:
            raise BadRequestError(f"skip needs a count >= 1, got {count}")

        async def attempt() -> MessageId:
            state, version = await self._stored_cursor(name, subscription)
            acks = ranges_from_state(state)
            skipped = 0
            async for message in self._unacknowledged(name, acks):
                acks.ack(message.previous, message.message_id)
                skipped += 1
                if skipped == count:
                    break
            changed = ranges_to_state(acks, read_compacted=state.read_compacted)
            await self.registry.write_cursor(name, subscription, changed, version)
            return acks.mark_delete

        await self.read(name)
        return await retry_cas(f"stream {name!r}: skip", attempt)

    async def peek(self, name: str, subscription: str, count: int) -> builtins.list[Message]:
        """The next `count` messages the subscription would deliver (none acknowledged)."""
        acks, _ = await self._cursor(name, subscription)
        found: builtins.list[Message] = []
        async for message in self._unacknowledged(name, acks):
            found.append(message)
            if len(found) >= count:
                break
        return found

    async def unsubscribe(self, name: str, subscription: str) -> None:
        """Delete a subscription; ConsumerBusyError while a consumer is connected (as
        Pulsar refuses), NoSuchSubscriptionError if there is none."""
        await self.read(name)
        await self._cursor(name, subscription)
        connected = await self.consumers(name, subscription)
        if connected:
            raise ConsumerBusyError(
                f"subscription {subscription!r} has connected consumers ({', '.join(connected)}): "
                f"close them first"
            )
        await self.registry.delete_cursor(name, subscription)

    async def cursors(self, name: str) -> dict[str, MessageId]:
        """Each subscription's mark-delete position."""
        return {sub: acks.mark_delete for sub, acks in (await self.cursor_states(name)).items()}

    async def _retention_cursors(self, name: str) -> builtins.list[tuple[MessageId, bool]]:
        """Each durable cursor's mark-delete position and whether it reads compacted."""
        return [
            (position_from_pb(state.mark_delete), state.read_compacted)
            for state in (await self._states(name)).values()
        ]

    async def reset_cursor(self, name: str, subscription: str, position: MessageId | str) -> None:
        """Move a subscription so the message AT `position` is delivered next, as
        Consumer.seek does (EARLIEST replays everything; LATEST skips to the end). A
        connected consumer picks the reset up when it next persists its cursor."""
        await self.read(name)
        target = parse_start(position)
        if target not in (EARLIEST, LATEST):
            target = position_before(target)
        await self._reset_mark(name, subscription, target)

    async def _reset_mark(self, name: str, subscription: str, mark: MessageId) -> None:
        stored, version = await self._stored_cursor(name, subscription)
        state = ranges_to_state(AckRanges(mark), read_compacted=stored.read_compacted)
        await self.registry.write_cursor(name, subscription, state, version)
        await self.registry.cursor_moved_back(name)  # retention must now see it

    async def reset_cursor_to_time(self, name: str, subscription: str, timestamp_ms: int) -> None:
        """Move a subscription so the first message published at or after timestamp_ms
        is delivered next (none yet: only what comes after now), as Consumer.seek(ms)."""
        await self._cursor(name, subscription)  # (NoSuchSubscriptionError before the scan)
        scanner = StreamScanner(self._ledgers, self.registry, name, EARLIEST, tail=False)
        mark = await scanner.position_before_time(timestamp_ms)
        await self._reset_mark(
            name, subscription, mark if mark != LATEST else await scanner.end_position()
        )

    async def create_subscription(
        self, name: str, subscription: str, position: Any = LATEST
    ) -> None:
        """Create a subscription no consumer holds yet (Pulsar's create-subscription):
        the message AT position comes first (LATEST: those published from now on).
        NodeExistsError when the stream has that subscription already."""
        target = parse_start(position)
        if target == LATEST:
            scanner = StreamScanner(self._ledgers, self.registry, name, EARLIEST, tail=False)
            target = await scanner.end_position()  # (NoSuchStreamError: none to scan)
        elif target != EARLIEST:
            target = position_before(target)
        try:
            await self.registry.write_cursor(name, subscription, ranges_to_state(AckRanges(target)))
        except NodeExistsError:
            raise NodeExistsError(f"stream {name!r} has a subscription {subscription!r}") from None
        await self.registry.cursor_moved_back(name)  # retention must now see it

    # -- stats --------------------------------------------------------------------------

    async def stats(self, name: str, *, count_messages: bool = True) -> dict[str, Any]:
        """A stream's ledgers, size and subscriptions. count_messages: also each
        subscription's backlog in messages, which reads the backlog (up to
        BACKLOG_COUNT_LIMIT messages); without it backlog_messages is None."""
        md, _ = await self.read(name)
        ledgers = []
        for i, info in enumerate(md.ledgers):
            entries, size = info.entries, info.size_bytes
            if i == len(md.ledgers) - 1:  # the current ledger: ask the bookies
                try:
                    handle = await self._ledgers.open(
                        info.ledger_id, password=STREAM_PASSWORD, recover=False
                    )
                    entries = handle.last_entry_id + 1
                    size = handle.metadata.length if handle.is_closed else size
                except NoSuchLedgerError:
                    pass
            ledgers.append(
                {"ledger_id": info.ledger_id, "entries": entries, "size_bytes": size,
                 "created_time_ms": info.created_time_ms}
            )  # fmt: skip
        subscriptions = {}
        for sub, acks in (await self.cursor_states(name)).items():
            mark = acks.mark_delete
            backlog = 0
            for ledger in ledgers:
                if ledger["ledger_id"] > mark.ledger_id:
                    backlog += ledger["entries"]
                elif ledger["ledger_id"] == mark.ledger_id:
                    backlog += max(0, ledger["entries"] - mark.entry_id - 1)
            messages: int | None = 0
            if backlog:
                messages = await self.backlog_messages(name, acks) if count_messages else None
            consumers = await self.consumers(name, sub)
            subscriptions[sub] = asdict(
                SubscriptionStats(describe(mark), backlog, messages, consumers)
            )
        return {
            "name": name,
            "ledgers": ledgers,
            "entries": sum(ledger["entries"] for ledger in ledgers),
            "size_bytes": sum(ledger["size_bytes"] for ledger in ledgers),
            "subscriptions": subscriptions,
        }

    # -- retention ----------------------------------------------------------------------

    async def trim(self, name: str, *, now: int | None = None) -> builtins.list[int]:
        """Apply retention now: CAS the list without the deletable ledgers FIRST, then
        delete them. Returns the deleted ledger ids. An unbounded stream lives in one
        ledger: its retention drops fragments instead (trim_fragments), and this
        returns []."""

        async def attempt() -> builtins.list[int]:
            md, version = await self.read(name)
            if md.mode == StreamMode.UNBOUNDED:
                await self.trim_fragments(name, now=now)
                return []
            view = view_of(md)
            horizon = None if view is None else view.horizon
            marks = retention_marks(await self._retention_cursors(name), horizon)
            spans = [
                LedgerSpan(i.ledger_id, i.entries, i.size_bytes, i.created_time_ms)
                for i in md.ledgers
            ]
            policy = RetentionPolicy(**_fields(md.retention, RetentionPolicy))
            at = now_ms() if now is None else now
            doomed = retention_plan(
                spans, marks, policy, at, None if horizon is None else horizon[0]
            )
            if not doomed:
                return []
            kept = [i for i in md.ledgers if i.ledger_id not in doomed]
            del md.ledgers[:]
            md.ledgers.extend(kept)
            # BadVersionError: a writer rolled or a cursor moved: plan again, fresh.
            await self.registry.write(name, md, version)
            return doomed

        doomed = await retry_cas(f"stream {name!r}: retention", attempt)
        for ledger_id in doomed:  # after the CAS: a crash leaks, never dangles
            try:
                await self._ledgers.delete(ledger_id)
            except NoSuchLedgerError:
                pass
        return doomed

    async def trim_fragments(self, name: str, *, now: int | None = None) -> builtins.list[int]:
        """Fragment retention of an unbounded stream (the rule:
        streamlib.protocol.stream_rules.fragment_retention_plan): drop the fragments of
        its ledger that every durable cursor has consumed and retention no longer keeps,
        by CAS of the ledger's metadata. Returns the first entry ids of the dropped
        fragments (bookies delete their entries in their next garbage collection)."""

        async def attempt() -> builtins.list[int]:
            # The stream's version is read BEFORE the cursors and checked in the same
            # transaction as the drop: a cursor created or moved back meanwhile moves it
            # (cursor_moved_back), and the plan is made again.
            md, version = await self.read(name)
            if md.mode != StreamMode.UNBOUNDED:
                raise BadRequestError(f"stream {name!r} is not unbounded: trim() drops ledgers")
            if not md.ledgers:
                return []
            policy = RetentionPolicy(**_fields(md.retention, RetentionPolicy))
            view = view_of(md)
            if policy.time_ms <= 0 and policy.size_bytes <= 0 and not (policy.compacted and view):
                return []
            ledger_id = md.ledgers[0].ledger_id
            # A cursor on another ledger (none in one-ledger streams) or at EARLIEST needs
            # everything.
            horizon = None if view is None else view.horizon
            marks = fragment_retention_marks(
                await self._retention_cursors(name), horizon, ledger_id
            )
            horizon_entry = None if horizon is None else entry_in(horizon, ledger_id)
            at = now_ms() if now is None else now

            def plan(
                ledger: LedgerMetadata,
                marks: list[int] = marks,
                at: int = at,
                policy: RetentionPolicy = policy,
                horizon_entry: int | None = horizon_entry,
            ) -> int:
                spans = [
                    FragmentSpan(f.first_entry_id, f.created_time_ms, f.start_length)
                    for f in ledger.fragments
                ]
                return fragment_retention_plan(spans, marks, policy, at, horizon_entry)

            guard = (self.registry.stream_path(name), version)
            try:  # BadVersionError: a cursor moved back, or the stream changed: again
                return await self._ledgers.drop_fragments(ledger_id, plan, guard=guard)
            except NoSuchLedgerError:
                return []

        return await retry_cas(f"stream {name!r}: fragment retention", attempt)

    async def _view_unused(self, tag: bytes, ledger_id: int) -> tuple[str, int] | bool:
        """Whether a compacted view's ledger may go: False while it is its stream's --
        its live compactor's (the compactor's node names it) or installed, looked at in
        that order (a compactor installs, then lets its node go); else the stream's node
        and version, to delete it only while the stream has not moved (a compactor that
        outlived its node may install it meanwhile); True: no such stream."""
        try:
            stream = tag.decode()
            if await compacting_ledger(self.registry, stream) == ledger_id:
                return False
            md, version = await self.registry.read(stream)
        except (ValueError, MetadataNoSuchStream):  # (a malformed tag, a stream deleted)
            return True
        if md.HasField("compaction") and md.compaction.ledger_id == ledger_id:
            return False
        return self.registry.stream_path(stream), version

    async def sweep(self, *, grace_s: float = 300.0) -> builtins.list[int]:
        """Delete ledgers tagged as belonging to a stream that no stream's list holds
        (leaks of crashes between a list CAS and a delete, or of an abandoned takeover),
        and snapshot ledgers (snapshots.py) that no pointer names, once they are older
        than grace_s: a writer adds its new ledger to the list (or its pointer) right
        after creating it, so a young unlisted ledger may be on its way in."""
        listed: set[int] = set()
        for name in await self.list():
            try:
                md, _ = await self.read(name)
            except NoSuchStreamError:
                continue
            listed.update(i.ledger_id for i in md.ledgers)
            if md.HasField("compaction"):
                listed.add(md.compaction.ledger_id)
        swept = []
        cutoff = time.time() * 1000 - grace_s * 1000
        for ledger_id in await self._ledgers.list():
            if ledger_id in listed:
                continue
            try:
                ledger = await self._ledgers.metadata(ledger_id)
            except NoSuchLedgerError:
                continue
            if ledger.creation_time_ms > cutoff:
                continue
            snapshot_of = ledger.custom_metadata.get(snapshots.SNAPSHOT_OF)
            view_of_stream = ledger.custom_metadata.get(COMPACTED_VIEW_OF)
            guard: tuple[str, int] | None = None
            if view_of_stream is not None:
                unused = await self._view_unused(view_of_stream, ledger_id)
                if unused is False:
                    continue
                guard = None if unused is True else unused
            if snapshot_of is not None:
                if await snapshots.is_pointed_at(self.registry, snapshot_of, ledger_id):
                    continue
            elif "stream" not in ledger.custom_metadata:
                continue
            try:
                await self._ledgers.delete(ledger_id, guard=guard)
            except NoSuchLedgerError:
                continue  # (its owner deleted it meanwhile: a replaced snapshot's)
            except BadVersionError:
                continue  # (a view's stream moved meanwhile: maybe it installed it)
            swept.append(ledger_id)
        return swept
