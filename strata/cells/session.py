"""Session files: a conversation's K/V streamed between pool chunks and a file, one record
(`block_cells` positions) at a time; the format is in `kv/session_format.py`.

Memory: one `RecordBuffer` (block_cells x bytes_per_cell, host memory) is the only copy
of K/V outside the pool at any time, whatever the conversation's length; the file is
read with `readinto` (the page cache is not this process's memory).

Writes go to a temporary name in the same directory, are fsynced, then renamed over the
real name (and the directory fsynced), so a crash never leaves a half file under it
(`kv/session_disk.py`: the names, the publication, storage errors by name).

Saving and restoring may run on a worker thread (engine/session_jobs.py) while the engine
steps: they touch only the cells of the chunks the engine holds for them, and what must
happen on the engine's thread (telling the ring which cells a restore wrote) is left to it
(`announce_written`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch

from strata.errors import SessionFileError
from strata.cells.int8 import SCALE_DTYPE
from strata.kv import session_disk as disk
from strata.kv.groups import LayerGroup
from strata.kv.session_format import CRC, KVGeometry, SessionHeader, crc32, read_header
from strata.kv.session_groups import overlap
from strata.cells.storage import KV_TORCH_DTYPES, KVStorage

# A save flushes its file to the disk every this many bytes, so that the dirty pages it leaves
# in the page cache (and the writeback the kernel owes for them) stay bounded while the engine
# steps beside it; the last flush before the rename is then short.
SYNC_EVERY_BYTES = 64 << 20


def storage_geometry(storage: KVStorage) -> KVGeometry:
    heads, _, head_dim = storage.k[0].shape
    return KVGeometry(storage.num_layers, heads, head_dim, storage.kv_dtype)


def layer_parts(storage: KVStorage) -> list[list[torch.Tensor]]:
    """Per layer, the tensors a record holds in file order: K's parts, then V's (cells on dim 1)."""
    return [[*k.parts, *v.parts] for k, v in zip(storage.k, storage.v)]


class RecordBuffer:
    """Host memory for one record's payload (at most `block_cells` positions of every layer),
    with per-layer tensor views into it."""

    def __init__(self, geometry: KVGeometry, block_cells: int):
        self.geometry = geometry
        self.data = torch.empty(block_cells * geometry.bytes_per_cell, dtype=torch.uint8)
        self._bytes = memoryview(self.data.numpy())

    def payload(self, num_cells: int, num_layers: int) -> memoryview:
        return self._bytes[: num_cells * self.geometry.layers_bytes_per_cell(num_layers)]

    def views(self, num_cells: int, num_layers: int) -> list[list[torch.Tensor]]:
        """Per layer of the record's group: K data [heads, n, head_dim] (+ scale [heads, n]), then V's."""
        g, n = self.geometry, num_cells
        shapes = [((g.num_kv_heads, n, g.head_dim), KV_TORCH_DTYPES[g.kv_dtype])]
        if g.kv_dtype == "int8":
            shapes.append(((g.num_kv_heads, n), SCALE_DTYPE))
        out, offset = [], 0
        for _ in range(num_layers):
            layer = []
            for _kv in range(2):
                for (shape, dtype), per_cell in zip(shapes, g.part_bytes):
                    size = n * per_cell
                    layer.append(self.data[offset : offset + size].view(dtype).view(shape))
                    offset += size
            out.append(layer)
        return out


@dataclass(frozen=True)
class GroupCells:
    """Where one of the engine's layer groups keeps a conversation: its chunk ids (None: not
    held) and the spans of positions a restore writes (kv/session_groups.py)."""

    chunk_ids: Sequence[int | None]
    spans: Sequence[tuple[int, int]]


def cell_runs(chunk_ids: Sequence[int | None], chunk_size: int, start: int, num_cells: int
              ) -> list[tuple[int, int, int]]:
    """(flat cell, offset in the record, cells) for positions [start, start + num_cells) of a table."""
    runs, p, end = [], start, start + num_cells
    while p < end:
        n = min(chunk_size - p % chunk_size, end - p)
        chunk = chunk_ids[p // chunk_size]
        assert chunk is not None, f"position {p} is in no held chunk"
        runs.append((chunk * chunk_size + p % chunk_size, p - start, n))
        p += n
    return runs


def save_cells(path: str, header: SessionHeader, storage: KVStorage, group_ids: Sequence[Sequence[int | None]],
               on_record: Callable[[int], None] | None = None) -> int:
    """Writes `header` and the K/V of its records; `group_ids[g]`: the chunk ids of the header's
    group g in the engine's group g (one group: the table's). Returns the bytes written.

    Safe on a thread other than the one that steps the engine while no one writes those
    cells (engine/session.py holds them). `on_record(i)` runs after record i is written; what
    it raises ends the save. A storage failure is a StorageError (kv/session_disk.py), and
    nothing is left under `path` or a temporary name."""
    head = header.encode()
    size = header.file_size(len(head))
    disk.check_room(path, size)
    fd, tmp = disk.open_temporary(path, size)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(head)
            buf, parts = RecordBuffer(header.geometry, header.block_cells), layer_parts(storage)
            groups = header.file_groups
            unsynced = 0
            for i, (g, start, n) in enumerate(header.record_list()):
                layers = groups[g].layers
                views = buf.views(n, len(layers))
                for flat, offset, length in cell_runs(group_ids[g], storage.chunk_size, start, n):
                    for layer, dst_layer in zip(layers, views):
                        for src, dst in zip(parts[layer], dst_layer):
                            dst[:, offset : offset + length].copy_(src[:, flat : flat + length])
                payload = buf.payload(n, len(layers))
                f.write(payload)
                f.write(CRC.pack(crc32(payload)))
                unsynced += len(payload)
                if unsynced >= SYNC_EVERY_BYTES:  # dirty pages stay few: no writeback storm at the end
                    f.flush()
                    os.fdatasync(f.fileno())
                    unsynced = 0
                if on_record is not None:
                    on_record(i)
            f.flush()
            os.fsync(f.fileno())
    except OSError as exc:
        disk.discard(tmp)
        disk.raise_storage_error(exc, path, "writing", size)
    except BaseException:
        disk.discard(tmp)
        raise
    try:
        disk.publish(tmp, path, size)
    except BaseException:
        disk.discard(tmp)
        raise
    return size


@dataclass
class SessionReader:
    """An open session file whose header is read and whose size matches it."""

    path: str
    file: object
    header: SessionHeader
    header_bytes: int

    @classmethod
    def open(cls, path: str) -> SessionReader:
        try:
            f = open(path, "rb", buffering=0)  # noqa: SIM115 - closed by close()
        except OSError as exc:
            error = disk.storage_error(exc, path, "reading")
            if error is not None:
                raise error from exc
            raise SessionFileError(path, f"cannot be read ({exc.strerror or exc})") from exc
        try:
            header, header_bytes = read_header(f, path)
            size, expected = os.fstat(f.fileno()).st_size, header.file_size(header_bytes)
            if size != expected:
                raise SessionFileError(path, f"{size} bytes where its header says {expected} (truncated or extended)")
        except BaseException:
            f.close()
            raise
        return cls(path, f, header, header_bytes)

    def close(self) -> None:
        self.file.close()

    def __enter__(self) -> SessionReader:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def num_bytes(self) -> int:
        return self.header.file_size(self.header_bytes)

    def records(self, buf: RecordBuffer) -> Iterator[tuple[int, int, int]]:
        """Reads each record into `buf` and checks its CRC; yields (group index, first position, cells)."""
        h = self.header
        groups = h.file_groups
        self.file.seek(self.header_bytes)
        for i, (g, start, n) in enumerate(h.record_list()):
            payload = buf.payload(n, len(groups[g].layers))
            try:
                got = self.file.readinto(payload)
                crc = self.file.read(CRC.size)
            except OSError as exc:
                raise SessionFileError(self.path, f"read failed in record {i} ({exc.strerror or exc})") from exc
            if got != len(payload) or len(crc) != CRC.size:
                raise SessionFileError(self.path, f"truncated in record {i} (cells {start}..{start + n})")
            if CRC.unpack(crc)[0] != crc32(payload):
                raise SessionFileError(self.path, f"record {i} (cells {start}..{start + n}): checksum mismatch")
            yield g, start, n

    def verify(self) -> None:
        for _ in self.records(RecordBuffer(self.header.geometry, self.header.block_cells)):
            pass

    def restore_cells(self, storage: KVStorage, targets: Sequence[GroupCells],
                      on_record: Callable[[int], None] | None = None) -> None:
        """Streams every record into the engine's groups: a layer's cells at the positions of its
        group's `targets[g].spans` go to that group's chunks (position p -> its chunk's cell), the
        rest of the record is read and checked only (a version 1 file into windowed groups).
        `on_record(i)` runs after record i is in (what it raises ends the restore). The caller
        then calls `announce_written` on the engine's thread."""
        buf, parts, groups = RecordBuffer(self.header.geometry, self.header.block_cells), layer_parts(storage), \
            self.header.file_groups
        for i, (g, start, n) in enumerate(self.records(buf)):
            for layer, src_layer in zip(groups[g].layers, buf.views(n, len(groups[g].layers))):
                target = targets[storage.layer_group[layer]]
                for at, cells in overlap(start, n, target.spans):
                    for flat, offset, length in cell_runs(target.chunk_ids, storage.chunk_size, start + at, cells):
                        for dst, src in zip(parts[layer], src_layer):
                            dst[:, flat : flat + length].copy_(src[:, at + offset : at + offset + length])
            if on_record is not None:
                on_record(i)


def announce_written(storage: KVStorage, targets: Sequence[GroupCells]) -> None:
    """Tells the storage's listeners (each group's ring) that every group's `targets[g].spans` of
    its chunks were written other than by attention. On the engine's thread."""
    for g, target in enumerate(targets):
        for start, end in target.spans:
            for flat, _, length in cell_runs(target.chunk_ids, storage.chunk_size, start, end - start):
                storage.cells_written(flat, length, g)


def check_compatible(header: SessionHeader, path: str, fingerprint: str, geometry: KVGeometry) -> None:
    """SessionFileError (code session_mismatch) unless the file was made by this model and K/V geometry."""
    if header.fingerprint != fingerprint:
        raise SessionFileError(path, f"made by another model (fingerprint {header.fingerprint}, this model "
                                     f"is {fingerprint})", code="session_mismatch")
    if header.geometry != geometry:
        raise SessionFileError(path, f"K/V geometry {header.geometry} does not match this engine's {geometry}",
                               code="session_mismatch")


def check_groups(header: SessionHeader, path: str, groups: Sequence[LayerGroup]) -> None:
    """SessionFileError (session_mismatch) when a version 2 file's layer groups are not the
    engine's `groups` (empty: one group of every layer, which a version 1 file always fits)."""
    if not header.groups:
        return
    mine = tuple((g.window, tuple(g.layers)) for g in groups)
    theirs = tuple((g.window, g.layers) for g in header.groups)
    if not groups:
        windowed = ", ".join(f"layers {list(g.layers)} in a {g.window}-cell window" for g in header.groups[1:])
        raise SessionFileError(path, f"holds sliding-window layer groups ({windowed}: only the cells of their "
                                     "windows), and this engine keeps every cell of every layer (one group: "
                                     "--kv-window-groups off, no --kv-pool-tokens or --kv-resident): restore it "
                                     "in an engine with layer groups", code="session_mismatch")
    if mine != theirs:
        raise SessionFileError(path, f"layer groups {_describe(theirs)} do not match this engine's "
                                     f"{_describe(mine)}", code="session_mismatch")


def _describe(groups) -> str:
    return "[" + ", ".join(f"{'full' if w is None else f'window {w}'}: layers {list(ls)}" for w, ls in groups) + "]"
