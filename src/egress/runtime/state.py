"""Keyed state of a partition job: internal state clients and external state tables.

Internal state (Flow's ``TMutableStateKeyClient`` over YsonState) is a typed value per key, stored
in the engine's ``state`` table under ``(computation, state name, key)``. The value type is a
pydantic model or a dataclass; values are stored as JSON (pydantic's ``TypeAdapter``).

External state (Flow's ``InitExternalStateClient``) is a user-named table of rows with declared
columns, one row per key, stored in the engine's ``external_state`` table as MessagePack
(``egress.rows``: a ``str`` column may hold ``bytes``, kept exactly, as Flow's strings are byte
strings) and printed by ``egress state dump``.

Both are read through an accessor obtained with ``client.get(key)`` while a message or timer is
handled. Whatever was read or changed through an accessor is serialised when the call returns and
committed with the epoch, together with the outputs and input positions (exactly-once). A value
that cannot be serialised raises :class:`~egress.errors.ProcessFunctionError` naming the state,
the key and the message or timer.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar

from pydantic import TypeAdapter

from egress.errors import ProcessFunctionError
from egress.keys import decode_key, encode_key, partition_of
from egress.rows import decode_row, encode_row

M = TypeVar("M")

COLUMN_TYPES: dict[type, tuple[type, ...]] = {int: (int,), float: (float, int), str: (str, bytes), bool: (bool,)}
"""The Python values each external state column type accepts (``str``: Flow's byte string, text or bytes)."""


class _KeyedClient:
    """Values per key of one partition, loaded once and changed in memory until the commit."""

    def __init__(self, store: StateStore, name: str) -> None:
        self._store = store
        self.name = name
        self._values: dict[tuple[Any, ...], Any] = {}
        self._raw: dict[tuple[Any, ...], bytes] = {}

    def _load(self, rows: Mapping[bytes, bytes]) -> None:
        self._values.clear()
        self._raw = {decode_key(key): value for key, value in rows.items()}

    def _lookup(self, key: tuple[Any, ...]) -> tuple[bool, Any]:
        if key in self._values:
            return True, self._values[key]
        raw = self._raw.pop(key, None)
        if raw is None:
            return False, None
        value = self._decode(raw)
        self._values[key] = value
        return True, value

    def _touch(self, key: tuple[Any, ...]) -> tuple[Any, ...]:
        key = tuple(key)
        self._store._touch(self, key)
        return key

    def _serialised(self, key: tuple[Any, ...]) -> bytes | None:
        found, value = self._lookup(key)
        return self._encode(value) if found else None

    def _set(self, key: tuple[Any, ...], value: Any) -> None:
        self._raw.pop(key, None)
        self._values[key] = value

    def _delete(self, key: tuple[Any, ...]) -> None:
        self._raw.pop(key, None)
        self._values.pop(key, None)

    def peek(self, key: tuple[Any, ...]) -> Any:
        """The current value of ``key`` or ``None``, without recording a change (for inspection)."""
        return self._lookup(tuple(key))[1]

    def keys(self) -> list[tuple[Any, ...]]:
        """The keys that have a value now (this partition only), in no particular order."""
        return [*self._values, *self._raw]

    def _encode(self, value: Any) -> bytes:
        raise NotImplementedError

    def _decode(self, raw: bytes) -> Any:
        raise NotImplementedError


class StateClient(_KeyedClient, Generic[M]):
    """Internal keyed state ``name`` with values of type ``model`` (upstream ``TMutableStateKeyClient``).

    ``get(key)`` returns a :class:`StateAccessor` for ``key`` (a tuple of ``group_by`` values, as
    in ``Message.key``); keys of other partitions raise ``KeyError``.
    """

    def __init__(self, store: StateStore, name: str, model: type[M]) -> None:
        super().__init__(store, name)
        self.model = model
        self._adapter: TypeAdapter[M] = TypeAdapter(model)

    def get(self, key: tuple[Any, ...]) -> StateAccessor[M]:
        return StateAccessor(self, self._touch(key))

    def _encode(self, value: Any) -> bytes:
        return self._adapter.dump_json(value, warnings="error")

    def _decode(self, raw: bytes) -> Any:
        return self._adapter.validate_json(raw)


class StateAccessor(Generic[M]):
    """The state of one key (upstream ``TStateAccessor``).

    ``value`` is the stored value, or a new ``Model()`` when the key has none (mutate it in
    place: the change is saved when the call returns); ``exists`` tells whether a value is stored;
    ``set(value)`` replaces it; ``clear()`` deletes it (upstream ``state.Clear()``).
    """

    __slots__ = ("_client", "_key")

    def __init__(self, client: StateClient[M], key: tuple[Any, ...]) -> None:
        self._client = client
        self._key = key

    @property
    def key(self) -> tuple[Any, ...]:
        return self._key

    @property
    def exists(self) -> bool:
        return self._client._lookup(self._key)[0]

    @property
    def value(self) -> M:
        found, value = self._client._lookup(self._key)
        if found:
            return value  # type: ignore[no-any-return]
        model = self._client.model
        try:
            created = model()
        except Exception as error:
            raise TypeError(
                f"state {self._client.name!r} has no value for key {list(self._key)!r} and {model.__name__}() "
                f"cannot be built without arguments ({error}); check .exists and call .set(value) first"
            ) from error
        self._client._set(self._key, created)
        return created

    def set(self, value: M) -> None:
        model = self._client.model
        if not isinstance(value, model):
            raise TypeError(f"state {self._client.name!r} holds {model.__name__}, got {type(value).__name__}")
        self._client._set(self._key, value)

    def clear(self) -> None:
        self._client._delete(self._key)


class ExternalStateClient(_KeyedClient):
    """External state: the user table ``table`` with ``columns`` (name → int, float, str or bool),
    one row per key (upstream ``TSimpleExternalStateManager`` over a user table). Every column is
    nullable; a ``str`` column holds ``str`` or ``bytes`` (:data:`COLUMN_TYPES`); ``get(key)``
    returns an :class:`ExternalRow`."""

    def __init__(self, store: StateStore, table: str, columns: Mapping[str, type]) -> None:
        super().__init__(store, table)
        for column, kind in columns.items():
            if kind not in COLUMN_TYPES:
                raise TypeError(f"external state {table!r}: column {column!r} has type {kind!r}; "
                                "use int, float, str or bool")
        self.columns = dict(columns)

    def get(self, key: tuple[Any, ...]) -> ExternalRow:
        return ExternalRow(self, self._touch(key))

    def _encode(self, value: Any) -> bytes:
        return encode_row(value)

    def _decode(self, raw: bytes) -> Any:
        return decode_row(raw)


class ExternalRow:
    """The row of one key in an external state table: ``get_column(name)`` (None when unset,
    upstream ``GetColumnValue<std::optional<T>>``), ``set_column(name, value)``, ``clear()``
    (delete the row), ``columns`` (a copy of the row)."""

    __slots__ = ("_client", "_key")

    def __init__(self, client: ExternalStateClient, key: tuple[Any, ...]) -> None:
        self._client = client
        self._key = key

    def _kind(self, column: str) -> type:
        kind = self._client.columns.get(column)
        if kind is None:
            raise KeyError(f"external state {self._client.name!r} has no column {column!r} "
                           f"(columns: {', '.join(self._client.columns)})")
        return kind

    @property
    def columns(self) -> dict[str, Any]:
        return dict(self._client._lookup(self._key)[1] or {})

    def get_column(self, column: str) -> Any:
        self._kind(column)
        row = self._client._lookup(self._key)[1]
        return None if row is None else row.get(column)

    def set_column(self, column: str, value: Any) -> None:
        kind = self._kind(column)
        if value is not None and (not isinstance(value, COLUMN_TYPES[kind])
                                  or (kind is not bool and isinstance(value, bool))):
            raise TypeError(f"external state {self._client.name!r}: column {column!r} is {kind.__name__}, "
                            f"got {type(value).__name__}")
        row = dict(self._client._lookup(self._key)[1] or {})
        row[column] = value
        self._client._set(self._key, row)

    def clear(self) -> None:
        self._client._delete(self._key)


class StateStore:
    """Every state client of one partition job and the writes not yet committed.

    ``begin()`` / ``end(where)`` bracket one call of the process function: ``end`` serialises
    every value touched during the call into ``writes`` (internal: ``(name, encoded key)``) and
    ``external_writes`` (``(table, encoded key)``), ``None`` meaning delete. ``take_writes()``
    hands them to the epoch commit.
    """

    def __init__(self, partition: int = 0, partition_count: int = 1) -> None:
        self.partition = partition
        self.partition_count = partition_count
        self.internal: dict[str, StateClient[Any]] = {}
        self.external: dict[str, ExternalStateClient] = {}
        self.writes: dict[tuple[str, bytes], bytes | None] = {}
        self.external_writes: dict[tuple[str, bytes], bytes | None] = {}
        self._touched: dict[tuple[_KeyedClient, tuple[Any, ...]], None] = {}
        self._current_key: tuple[Any, ...] | None = None

    def state_client(self, name: str, model: type[M]) -> StateClient[M]:
        if name in self.internal:
            raise ValueError(f"state client {name!r} is initialised twice")
        client = StateClient(self, name, model)
        self.internal[name] = client
        return client

    def external_state_client(self, table: str, columns: Mapping[str, type]) -> ExternalStateClient:
        if table in self.external:
            raise ValueError(f"external state client {table!r} is initialised twice")
        client = ExternalStateClient(self, table, columns)
        self.external[table] = client
        return client

    def load(self, internal: Mapping[str, Mapping[bytes, bytes]],
             external: Mapping[str, Mapping[bytes, bytes]]) -> None:
        """Replace the in-memory values by committed ones (``name → encoded key → stored bytes``)."""
        for name, client in self.internal.items():
            client._load(internal.get(name, {}))
        for table, external_client in self.external.items():
            external_client._load(external.get(table, {}))

    def _touch(self, client: _KeyedClient, key: tuple[Any, ...]) -> None:
        if key != self._current_key and self.partition_count > 1 and \
                partition_of(encode_key(key), self.partition_count) != self.partition:
            raise KeyError(f"key {list(key)!r} of state {client.name!r} belongs to another partition")
        self._touched[(client, key)] = None

    def begin(self, key: tuple[Any, ...] | None) -> None:
        self._current_key = key
        self._touched.clear()

    def end(self, where: Callable[[], str]) -> None:
        """Serialise what the call touched; raises ``ProcessFunctionError`` naming ``where()``."""
        for client, key in self._touched:
            try:
                value = client._serialised(key)
            except Exception as error:
                raise ProcessFunctionError(
                    f"state {client.name!r} for key {list(key)!r} cannot be serialised ({type(error).__name__}: "
                    f"{error}) after {where()}; nothing from this batch was committed") from error
            target = self.external_writes if isinstance(client, ExternalStateClient) else self.writes
            target[(client.name, encode_key(key))] = value
        self._touched.clear()

    def discard(self) -> None:
        """Forget the touches of a call that raised (the job stops; nothing is committed)."""
        self._touched.clear()

    def take_writes(self) -> tuple[dict[tuple[str, bytes], bytes | None], dict[tuple[str, bytes], bytes | None]]:
        writes, external = self.writes, self.external_writes
        self.writes, self.external_writes = {}, {}
        return writes, external
