"""Which live files of a Delta table may hold some of a batch's keys, kept in memory between lookups.

The stream's de-duplication asks every micro-batch for the silver rows that hold the batch's keys.
:meth:`LakeTable.lookup` answers by reading the key column of every live file, and silver gains a
file per micro-batch: at a 1 s trigger that is 3,600 files an hour until maintenance compacts them,
and the lookup grew with them (~2 ms a file on 2 cores). :class:`KeyIndex` keeps a 64-bit hash of
each key of each live file it has seen, syncs with the table's log at every lookup (a file it has not
seen has its key column read once; a file no longer live, after a compaction or a recompute's
overwrite, is forgotten), and reads only the files whose hashes match.

Exact, not probabilistic: rows come from the candidate files filtered on the keys themselves, so a
hash collision costs one file read, never a wrong row; a file the index does not hold is read as
:meth:`LakeTable.lookup` would. Bounded: at most ``max_keys`` keys are held (12 bytes each: the hash
and the file's number); past it the oldest files leave the index and are scanned at each lookup,
slower but still exact.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pandas.util import hash_array

from tidewater.lake.tables import DataFile, LakeTable, read_data_file

DEFAULT_MAX_KEYS = 8_000_000  # ~96 MB; Settings.dedup_index_max_keys
MERGE_AT = 64  # recent files probed one by one before they are merged into one sorted array


def key_hashes(values: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """A 64-bit hash of each non-null value; equal values of the same kind hash equally, whatever the
    Arrow type they are stored in (string, large_string, string_view; any integer width)."""
    values = pc.drop_null(values)
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    kind = values.type
    if pa.types.is_integer(kind):
        return hash_array(values.cast(pa.int64()).to_numpy(), categorize=False)
    return _text_hashes(values.cast(pa.large_string()))


def sorted_unique(hashes: np.ndarray) -> np.ndarray:
    """``np.unique(hashes)``: a sort and one comparison of neighbours. numpy 2.4's ``unique`` took 45-52 ms
    for 200k hashes where its ``sort`` took 2."""
    ordered = np.sort(hashes)
    if len(ordered) < 2:
        return ordered
    return ordered[np.concatenate(([True], ordered[1:] != ordered[:-1]))]


GATHER_BYTES = 4_000_000  # values of mixed widths are hashed in parts of about this many bytes
_SEED = np.uint64(0x9E3779B97F4A7C15)
_MIX_1, _MIX_2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)


def _mixed(h: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer, in place: every bit of the result depends on every bit of ``h``."""
    h ^= h >> np.uint64(30)
    h *= _MIX_1
    h ^= h >> np.uint64(27)
    h *= _MIX_2
    h ^= h >> np.uint64(31)
    return h


def _width_hashes(block: np.ndarray) -> np.ndarray:
    """The hash of each row of ``block``: values of one width, as bytes (rows x width)."""
    rows, width = block.shape
    padded = np.zeros((rows, -(-width // 8) * 8), dtype=np.uint8)
    padded[:, :width] = block
    h = np.full(rows, width, dtype=np.uint64)
    h *= _SEED
    for word in padded.view("<u8").T:
        h ^= word
        _mixed(h)
    return _mixed(h)


def _text_hashes(values: pa.LargeStringArray) -> np.ndarray:
    """A hash of each value's UTF-8 bytes, read from Arrow's buffers: its length, then each 8-byte word
    (zero-padded), folded through :func:`_mixed`. Vectorized per distinct length, so keys of one width
    (UUIDs, fixed-width ids) are one reshape of the data buffer and no Python object per key. pandas'
    ``hash_array`` needed a Python string per key: 200k UUIDs, ~80-160 ms against ~10 (twentieth stop).
    """
    count = len(values)
    _, offsets_buffer, data_buffer = values.buffers()
    offsets = np.frombuffer(offsets_buffer, dtype=np.int64, count=count + 1, offset=values.offset * 8)
    data = np.frombuffer(data_buffer, dtype=np.uint8) if data_buffer is not None else np.empty(0, np.uint8)
    lengths = np.diff(offsets)
    if count and lengths.min() == lengths.max():  # one width: the values lie back to back
        width = int(lengths[0])
        return _width_hashes(data[offsets[0] : offsets[0] + count * width].reshape(count, width))
    hashes = np.empty(count, dtype=np.uint64)
    for width in np.unique(lengths).tolist():
        rows = np.flatnonzero(lengths == width)
        step = max(1, GATHER_BYTES // max(width, 1))  # the gather's index holds 8 bytes per byte
        for part in range(0, len(rows), step):
            chosen = rows[part : part + step]
            hashes[chosen] = _width_hashes(data[offsets[chosen, None] + np.arange(width)])
    return hashes


class KeyIndex:
    """The rows of ``table`` whose ``column`` holds one of a batch's keys, reading few files (see above).

    One per table and writer process: the streaming job's silver writer keeps it for the life of the
    query and asks under the table's lock, so no other writer changes the table between the sync and
    the read."""

    def __init__(self, table: LakeTable, column: str, *, max_keys: int = DEFAULT_MAX_KEYS) -> None:
        self.table = table
        self.column = column
        self.max_keys = max_keys
        self._recent: dict[str, np.ndarray] = {}  # file URI -> its keys' sorted unique hashes
        self._merged = np.empty(0, dtype=np.uint64)  # sorted hashes of older files ...
        self._merged_file = np.empty(0, dtype=np.int32)  # ... and, for each, its file's number
        self._paths: list[str] = []  # file number -> URI, for the merged arrays
        self._indexed: dict[str, int] = {}  # URI -> keys held, oldest first
        self._evicted: set[str] = set()  # live files left out for the bound: scanned at each lookup
        self.keys_held = 0
        self.files_read = 0  # key columns read to index files

    def lookup(self, values: pa.Array, columns: Sequence[str] | None = None) -> pa.Table:
        """Rows of the current snapshot whose key is one of ``values`` (the answer of :meth:`LakeTable.lookup`)."""
        snapshot = self.table.open()
        schema = LakeTable.arrow_schema(snapshot)
        wanted = list(columns) if columns else schema.names
        found = [schema.empty_table().select(wanted)]
        keys = pc.drop_null(values)  # is_in and the probe (sorted_unique) need no unique keys
        if len(keys) == 0:
            return found[0]
        files = {data_file.uri: data_file for data_file in self.table.files_of(snapshot)}
        self._sync(files, schema)
        probe = sorted_unique(key_hashes(keys))
        for uri in sorted(self._candidates(probe)) + sorted(self._evicted):
            rows = read_data_file(files[uri], schema, wanted)
            held = rows.column(self.column)
            found.append(rows.filter(pc.is_in(held, value_set=keys.cast(held.type))))
        return pa.concat_tables(found)

    def _sync(self, files: dict[str, DataFile], schema: pa.Schema) -> None:
        self._evicted &= files.keys()
        gone = {uri for uri in self._indexed if uri not in files}
        if gone:
            self._forget(gone)
        for uri, data_file in files.items():
            if uri in self._indexed or uri in self._evicted:
                continue
            hashes = sorted_unique(key_hashes(read_data_file(data_file, schema, [self.column]).column(0)))
            self.files_read += 1
            self._recent[uri] = hashes
            self._indexed[uri] = len(hashes)
            self.keys_held += len(hashes)
        while self.keys_held > self.max_keys:  # the oldest files leave the index
            oldest = next(iter(self._indexed))
            self._forget({oldest})
            self._evicted.add(oldest)
        if len(self._recent) > MERGE_AT:
            self._merge()

    def _forget(self, paths: set[str]) -> None:
        for path in paths:
            self._recent.pop(path, None)
            self.keys_held -= self._indexed.pop(path, 0)
        dead = [number for number, path in enumerate(self._paths) if path in paths]
        if dead:
            keep = ~np.isin(self._merged_file, np.array(dead, dtype=np.int32))
            self._merged, self._merged_file = self._merged[keep], self._merged_file[keep]  # still sorted

    def _merge(self) -> None:
        """Fold the recent files into the sorted arrays (files renumbered, forgotten ones dropped)."""
        live: list[str] = []
        position: dict[str, int] = {}
        for path in self._paths:
            if path in self._indexed and path not in self._recent:
                position[path] = len(live)
                live.append(path)
        renumbered = np.array([position.get(path, -1) for path in self._paths] or [-1], dtype=np.int32)
        files = renumbered[self._merged_file]
        keep = files >= 0
        hashes, numbers = [self._merged[keep]], [files[keep]]
        for path, recent in self._recent.items():
            hashes.append(recent)
            numbers.append(np.full(len(recent), len(live), dtype=np.int32))
            live.append(path)
        merged, merged_file = np.concatenate(hashes), np.concatenate(numbers)
        order = np.argsort(merged, kind="stable")
        self._merged, self._merged_file, self._paths = merged[order], merged_file[order], live
        self._recent = {}

    def _candidates(self, probe: np.ndarray) -> set[str]:
        """Files whose hashes include one of ``probe``."""
        found = {path for path, hashes in self._recent.items() if _any_in(probe, hashes)}
        if len(self._merged):
            for start, stop in zip(*_matching(self._merged, probe), strict=True):
                found.update(self._paths[number] for number in self._merged_file[start:stop])
        return found


def _matching(sorted_hashes: np.ndarray, probe: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per probe found, the range ``[lo, hi)`` of ``sorted_hashes`` equal to it."""
    lo = np.searchsorted(sorted_hashes, probe, side="left")
    found = sorted_hashes[np.minimum(lo, len(sorted_hashes) - 1)] == probe
    return lo[found], np.searchsorted(sorted_hashes, probe[found], side="right")


def _any_in(probe: np.ndarray, sorted_hashes: np.ndarray) -> bool:
    """Whether two sorted arrays share a value: the smaller searched in the larger (a micro-batch of a
    backlog probes 200k keys; a file of a low rate holds a few thousand)."""
    small, large = (probe, sorted_hashes) if len(probe) <= len(sorted_hashes) else (sorted_hashes, probe)
    if not len(small):
        return False
    at = np.minimum(np.searchsorted(large, small), len(large) - 1)
    return bool(np.any(large[at] == small))
