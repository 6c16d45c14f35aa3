"""The session file format: docs/sessions.md is its one description (byte layout,
checksums, what a restore checks); this module reads and writes the header, and
`cells/session.py` streams the records.

Checksums are zlib's CRC-32 (the standard library), one per record and one over the
header: 3.8 GB/s on these cores, faster than the disk and the cell copies it sits
between, and it detects every burst error of up to 32 bits (any flipped byte) in a
record. A faster hash (xxHash) would add a dependency for a cost that is not the
bottleneck (benchmarks/session.py measures save and restore whole).

Version 1 holds one group of every layer, every cell. Version 2 states the layer groups
(kv/groups.py, kv/session_groups.py): each group's window, layers and the spans of positions
its records hold; the full group holds every cell, a windowed group the cells of the chunks
its table held. An engine of one group writes version 1 (older readers read it); both read.
"""

from __future__ import annotations

import json
import struct
import zlib
from dataclasses import asdict, dataclass, field, replace

from strata.errors import SessionFileError
from strata.kv.session_groups import FileGroup, merge, records

MAGIC = b"STRATAKV"
FORMAT_VERSION = 2  # the newest this strata writes and reads
VERSIONS = (1, 2)
PREFIX = struct.Struct("<8sII")  # magic, version, header length
CRC = struct.Struct("<I")
MAX_HEADER_BYTES = 64 << 20  # a header of 4M tokens in JSON; more is a corrupt length
KV_DTYPE_BYTES = {"f32": 4, "f16": 2, "bf16": 2, "int8": 1}
INT8_SCALE_BYTES = 2  # float16 per (head, cell)


def crc32(data) -> int:
    return zlib.crc32(data) & 0xFFFFFFFF


@dataclass(frozen=True)
class KVGeometry:
    """What a file's K/V must match to go into a pool: every field equal."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    kv_dtype: str  # f32 | f16 | bf16 | int8

    @property
    def part_bytes(self) -> list[int]:
        """Bytes per cell of each tensor one layer's K (or V) keeps: data, then int8 scales."""
        data = self.num_kv_heads * self.head_dim * KV_DTYPE_BYTES[self.kv_dtype]
        return [data, self.num_kv_heads * INT8_SCALE_BYTES] if self.kv_dtype == "int8" else [data]

    @property
    def bytes_per_cell(self) -> int:
        return 2 * self.num_layers * sum(self.part_bytes)

    def layers_bytes_per_cell(self, num_layers: int) -> int:
        """K and V of one position in `num_layers` layers (a group's record)."""
        return 2 * num_layers * sum(self.part_bytes)


@dataclass(frozen=True)
class SessionHeader:
    fingerprint: str  # the model's weights digest (loader/fingerprint.py)
    geometry: KVGeometry
    block_cells: int  # positions per record (the saving pool's chunk size)
    token_ids: list[int] = field(default_factory=list)  # one per cell
    checkpoints: list[int] = field(default_factory=list)  # turn starts, ascending, <= num_cells
    # An application's own JSON object, opaque to the engine (`strata chat` keeps its turns
    # under "chat"); optional: left out of the header when empty, and ignored by readers of
    # version 1 that predate it, so files stay readable both ways.
    metadata: dict = field(default_factory=dict)
    # Version 2: the layer groups (the full one first); empty: version 1, one group of every layer.
    groups: tuple[FileGroup, ...] = ()
    windows_kept: list[int] = field(default_factory=list)  # positions whose windows every windowed group holds

    @property
    def num_cells(self) -> int:
        return len(self.token_ids)

    @property
    def version(self) -> int:
        return 2 if self.groups else 1

    @property
    def file_groups(self) -> tuple[FileGroup, ...]:
        """The groups the records hold, in file order (version 1: one of every layer, every cell)."""
        if self.groups:
            return self.groups
        return (FileGroup(None, tuple(range(self.geometry.num_layers)), ((0, self.num_cells),)),)

    def record_list(self) -> list[tuple[int, int, int]]:
        """(group index, first position, cells) of every record in file order: each group of
        layers in turn, its spans cut into `block_cells` pieces (a group of no layer has none)."""
        return [(g, start, n) for g, group in enumerate(self.file_groups) if group.layers
                for start, n in records(group.spans, self.block_cells)]

    @property
    def num_records(self) -> int:
        return len(self.record_list())

    def encode(self) -> bytes:
        """The prefix, the JSON header and its CRC: everything before the first record."""
        # The fields by hand, in asdict's order: asdict deep-copies every token id (slow on long files).
        fields = {"fingerprint": self.fingerprint, "geometry": asdict(self.geometry), "block_cells": self.block_cells,
                  "token_ids": self.token_ids, "checkpoints": self.checkpoints, "metadata": self.metadata}
        if not self.metadata:
            del fields["metadata"]
        if self.groups:
            fields["groups"] = [{"window": g.window, "layers": list(g.layers), "spans": [list(s) for s in g.spans]}
                                for g in self.groups]
            fields["windows_kept"] = self.windows_kept
        body = json.dumps(fields, separators=(",", ":")).encode()
        head = PREFIX.pack(MAGIC, self.version, len(body)) + body
        return head + CRC.pack(crc32(head))

    def kv_bytes(self) -> int:
        return sum(g.num_cells * self.geometry.layers_bytes_per_cell(len(g.layers)) for g in self.file_groups)

    def file_size(self, header_bytes: int) -> int:
        return header_bytes + self.kv_bytes() + self.num_records * CRC.size


def read_header(f, path: str) -> tuple[SessionHeader, int]:
    """(header, its size in bytes) from the start of the open file `f`; SessionFileError if bad."""
    prefix = f.read(PREFIX.size)
    if len(prefix) < PREFIX.size:
        raise SessionFileError(path, f"too short for a session file ({len(prefix)} bytes)")
    magic, version, length = PREFIX.unpack(prefix)
    if magic != MAGIC:
        raise SessionFileError(path, "not a strata session file (bad magic)")
    if version not in VERSIONS:
        raise SessionFileError(path, f"format version {version}; this strata reads versions "
                                     f"{', '.join(map(str, VERSIONS))}", code="session_version")
    if length > MAX_HEADER_BYTES:
        raise SessionFileError(path, f"header length {length} is corrupt")
    body = f.read(length)
    crc = f.read(CRC.size)
    if len(body) < length or len(crc) < CRC.size:
        raise SessionFileError(path, "truncated in its header")
    if CRC.unpack(crc)[0] != crc32(prefix + body):
        raise SessionFileError(path, "the header's checksum does not match (corrupt)")
    try:
        header = _parse(json.loads(body), version)
    except (ValueError, TypeError, KeyError) as exc:
        raise SessionFileError(path, f"the header is malformed ({exc})") from exc
    return header, PREFIX.size + length + CRC.size


def _parse(d: dict, version: int) -> SessionHeader:
    g = d["geometry"]
    geometry = KVGeometry(int(g["num_layers"]), int(g["num_kv_heads"]), int(g["head_dim"]), str(g["kv_dtype"]))
    if geometry.kv_dtype not in KV_DTYPE_BYTES or min(geometry.num_layers, geometry.num_kv_heads, geometry.head_dim) < 1:
        raise ValueError(f"bad geometry {g}")
    tokens, checkpoints = [int(t) for t in d["token_ids"]], [int(c) for c in d["checkpoints"]]
    if int(d["block_cells"]) < 1 or not tokens:
        raise ValueError("no cells, or blocks of no cells")
    if checkpoints != sorted(set(checkpoints)) or any(not 0 <= c <= len(tokens) for c in checkpoints):
        raise ValueError("checkpoints must ascend within the conversation")
    metadata = d.get("metadata", {})
    if not isinstance(metadata, dict):
        raise ValueError("metadata must be a JSON object")
    header = SessionHeader(str(d["fingerprint"]), geometry, int(d["block_cells"]), tokens, checkpoints, metadata)
    if version == 1:
        return header
    groups, kept = _parse_groups(d["groups"], geometry.num_layers, len(tokens)), [int(p) for p in d["windows_kept"]]
    if kept != sorted(set(kept)) or any(not 0 < p < len(tokens) for p in kept):
        raise ValueError("windows_kept must ascend within the conversation")
    return replace(header, groups=groups, windows_kept=kept)


def _parse_groups(raw: list, num_layers: int, num_cells: int) -> tuple[FileGroup, ...]:
    """Version 2's groups: the full one first, holding every cell; then windows ascending; every
    layer in exactly one group; spans merged, within the conversation."""
    groups = tuple(FileGroup(None if g["window"] is None else int(g["window"]), tuple(int(i) for i in g["layers"]),
                             tuple((int(s), int(e)) for s, e in g["spans"])) for g in raw)
    if len(groups) < 2 or groups[0].window is not None or groups[0].spans != ((0, num_cells),):
        raise ValueError("the first of two or more groups is the full one, holding every cell")
    windows = [g.window for g in groups[1:]]
    if any(w is None or w < 1 for w in windows) or windows != sorted(set(windows)):
        raise ValueError(f"windows must ascend: {windows}")
    if sorted(i for g in groups for i in g.layers) != list(range(num_layers)):
        raise ValueError(f"every one of the {num_layers} layers must be in exactly one group")
    if any(list(g.layers) != sorted(g.layers) or not g.spans or merge(g.spans) != g.spans
           or g.spans[0][0] < 0 or g.spans[-1][1] > num_cells for g in groups):
        raise ValueError("each group's layers ascend and its spans are merged, within the conversation")
    return groups
