"""Open a GGUF file (memory-mapped, through gguf-py's reader) with errors a user can act on.

The reader raises bare ValueError/IndexError on damaged files, loops without end on an array length
larger than the file, recurses into nested arrays and reads big-endian files byte-swapped. So we walk
the header ourselves first (``_check_header``: every length bounded by the bytes left, each tensor's
bytes aligned, in order and inside the file, as ggml's loader checks), then turn any parse failure
left into a ModelFileError.
"""

from __future__ import annotations

import math
import mmap
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader, GGUFValueType

from ..errors import ModelFileError

GGUF_MAGIC = b"GGUF"
GGML_MAX_DIMS = 4
_SCALAR_BYTES = {GGUFValueType.UINT8: 1, GGUFValueType.INT8: 1, GGUFValueType.BOOL: 1,
                 GGUFValueType.UINT16: 2, GGUFValueType.INT16: 2,
                 GGUFValueType.UINT32: 4, GGUFValueType.INT32: 4, GGUFValueType.FLOAT32: 4,
                 GGUFValueType.UINT64: 8, GGUFValueType.INT64: 8, GGUFValueType.FLOAT64: 8}


@dataclass(frozen=True)
class TensorInfo:
    name: str
    qtype: GGMLQuantizationType
    ne: tuple[int, ...]          # ggml order: ne[0] is the fastest-varying (input) dimension
    n_bytes: int
    offset: int                  # absolute byte offset in the file

    @property
    def rows(self) -> int:       # numpy view is (rows, ne[0]) for a matrix: y = W @ x
        return int(np.prod(self.ne[1:], dtype=np.int64)) if len(self.ne) > 1 else 1


class GGUFFile:
    """Metadata as plain Python values, tensor descriptors, and raw tensor bytes on demand."""

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)
        if self.path.is_dir():
            raise ModelFileError(f"{self.path}: is a folder, not a .gguf file")
        if not self.path.is_file():
            raise ModelFileError(f"{self.path}: no such file")
        try:
            self.file_size = self.path.stat().st_size
            with open(self.path, "rb") as f:
                magic = f.read(4)
            if magic != GGUF_MAGIC:
                raise ModelFileError(f"{self.path}: not a GGUF file (starts with {magic!r}, expected b'GGUF')")
            with open(self.path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
                _check_header(self.path, buf)
        except OSError as e:  # not the file's fault: say so (it read as "damaged" before, or as a traceback)
            raise ModelFileError(f"{self.path}: cannot read it: {e.strerror or e}") from None
        try:
            self._reader = GGUFReader(self.path, "r")
        except (ValueError, IndexError, KeyError, OverflowError, UnicodeDecodeError, RecursionError) as e:
            raise ModelFileError(f"{self.path}: damaged or truncated GGUF header ({e})") from None
        self.metadata: dict[str, object] = {
            name: _field_value(field) for name, field in self._reader.fields.items()
            if not name.startswith("GGUF.")
        }
        self.tensors: dict[str, TensorInfo] = {}
        for t in self._reader.tensors:       # _check_header has checked their bytes lie inside the file
            info = TensorInfo(t.name, GGMLQuantizationType(t.tensor_type),
                              tuple(int(x) for x in t.shape), int(t.n_bytes), int(t.data_offset))
            self.tensors[info.name] = info
        self._raw = {t.name: t.data for t in self._reader.tensors}

    @property
    def architecture(self) -> str | None:
        arch = self.metadata.get("general.architecture")
        return arch if isinstance(arch, str) else None

    def raw(self, name: str) -> np.ndarray:
        """The tensor's bytes as stored (memory-mapped; no copy): uint8 of shape (rows, row_bytes)."""
        info = self.tensors[name]
        data = np.asarray(self._raw[name])
        return data.view(np.uint8).reshape(info.rows, -1)


class _Cursor:
    """Little-endian reads from the header, each bounded by the bytes left in the file."""

    def __init__(self, path: Path, buf: mmap.mmap):
        self.path, self.buf, self.pos = path, buf, 0

    @property
    def left(self) -> int:
        return len(self.buf) - self.pos

    def skip(self, n: int, what: str) -> int:
        if n > self.left:
            raise ModelFileError(
                f"{self.path}: damaged or truncated GGUF header ({what} needs {n:,} bytes at offset {self.pos:,}, "
                f"the file has {len(self.buf):,}; fetch it again)")
        self.pos += n
        return self.pos - n

    def u32(self, what: str) -> int:
        return struct.unpack_from("<I", self.buf, self.skip(4, what))[0]

    def u64(self, what: str) -> int:
        return struct.unpack_from("<Q", self.buf, self.skip(8, what))[0]

    def string(self, what: str) -> str:
        n = self.u64(what)
        return self.buf[self.skip(n, what):self.pos].decode("utf-8", errors="replace")


def _check_header(path: Path, buf: mmap.mmap) -> None:
    """Refuse what gguf-py's reader would hang on, crash on or misread, naming the key or tensor."""
    c = _Cursor(path, buf)
    c.skip(4, "the magic")
    version = c.u32("the version")
    if version and version & 0xFFFF == 0:         # a small version read byte-swapped: gguf-py's byte_order 'S'
        raise ModelFileError(
            f"{path}: big-endian GGUF files are not supported; convert it with `gguf-convert-endian FILE little` "
            f"(gguf-py) or download the little-endian file")
    if version not in (2, 3):
        raise ModelFileError(f"{path}: GGUF version {version} is not supported (versions 2 and 3 are)")
    n_tensors, n_kv = c.u64("the tensor count"), c.u64("the key count")
    alignment = 32
    for _ in range(n_kv):                         # each key takes at least 13 bytes: bounded by the file
        key = c.string("a metadata key")
        what = f"key {key}"
        vtype = c.u32(what)
        if vtype == GGUFValueType.ARRAY:
            itype, count = c.u32(what), c.u64(what)
            if itype == GGUFValueType.ARRAY:      # ggml's loader refuses them too; gguf-py recurses
                raise ModelFileError(f"{path}: {what}: arrays of arrays are not supported "
                                     f"(llama.cpp refuses them too)")
            if itype != GGUFValueType.STRING and itype not in _SCALAR_BYTES:
                raise ModelFileError(f"{path}: {what}: unknown array item type {itype}")
            least = count * _SCALAR_BYTES.get(itype, 8)       # a string holds at least its 8-byte length
            if least > c.left:                    # gguf-py would loop `count` times past the end
                raise ModelFileError(
                    f"{path}: {what}: array of {count:,} items needs at least {least:,} bytes but "
                    f"{c.left:,} are left in the file (damaged or truncated; fetch it again)")
            if itype == GGUFValueType.STRING:
                for _ in range(count):
                    c.skip(c.u64(what), what)
            else:
                c.skip(least, what)
        elif vtype == GGUFValueType.STRING:
            c.string(what)
        elif vtype in _SCALAR_BYTES:
            at = c.skip(_SCALAR_BYTES[vtype], what)
            if key == "general.alignment":
                alignment = struct.unpack_from("<I", buf, at)[0] if vtype == GGUFValueType.UINT32 else 0
                if alignment == 0 or alignment & (alignment - 1):
                    found = alignment if vtype == GGUFValueType.UINT32 else f"a {GGUFValueType(vtype).name}"
                    raise ModelFileError(f"{path}: general.alignment: expected a UINT32 power of two, found {found}")
        else:
            raise ModelFileError(f"{path}: {what}: unknown value type {vtype}")

    extents = []
    for _ in range(n_tensors):                    # each takes at least 24 bytes
        name = c.string("a tensor name")
        what = f"tensor {name}"
        n_dims = c.u32(what)
        if n_dims > GGML_MAX_DIMS:
            raise ModelFileError(f"{path}: {what}: expected at most {GGML_MAX_DIMS} dimensions, found {n_dims}")
        ne = [c.u64(what) for _ in range(n_dims)]
        raw_type, offset = c.u32(what), c.u64(what)
        try:
            qtype = GGMLQuantizationType(raw_type)
            block, block_bytes = GGML_QUANT_SIZES[qtype]
        except (ValueError, KeyError):
            raise ModelFileError(f"{path}: {what}: unknown tensor type {raw_type}") from None
        if ne and ne[0] % block:
            raise ModelFileError(f"{path}: {what}: rows of {ne[0]} values are not whole {qtype.name} "
                                 f"blocks of {block}")
        extents.append((what, offset, math.prod(ne) // block * block_bytes))

    data_start = -(-c.pos // alignment) * alignment
    prev, prev_end = None, 0
    for what, offset, n_bytes in extents:         # what ggml's loader checks, less its exact-offset rule
        if offset % alignment:
            raise ModelFileError(f"{path}: {what}: data offset {offset:,} is not a multiple of general.alignment "
                                 f"({alignment}): the file is damaged (llama.cpp refuses it too)")
        if offset < prev_end:
            raise ModelFileError(f"{path}: {what}: data at offset {offset:,} overlaps {prev}, which ends at "
                                 f"{prev_end:,}: the file is damaged (llama.cpp refuses it too)")
        if data_start + offset + n_bytes > len(buf):
            raise ModelFileError(
                f"{path}: {what}: its data runs past the end of the file (needs bytes up to "
                f"{data_start + offset + n_bytes:,}, the file has {len(buf):,}): the file looks truncated "
                f"(an interrupted download? fetch it again)")
        prev, prev_end = what, offset + n_bytes


def _field_value(field) -> object:
    """A metadata field as a Python value: str, int, float, bool, or a list of those."""
    if not field.types:
        return None
    if field.types[0] == GGUFValueType.ARRAY:
        sub = field.types[-1]
        if sub == GGUFValueType.STRING:
            return [bytes(field.parts[i]).decode("utf-8", errors="replace") for i in field.data]
        return [_scalar(field.parts[i][0], sub) for i in field.data]
    if field.types[0] == GGUFValueType.STRING:
        return bytes(field.parts[field.data[0]]).decode("utf-8", errors="replace")
    return _scalar(field.parts[field.data[0]][0], field.types[0])


def _scalar(value, vtype: GGUFValueType) -> object:
    if vtype == GGUFValueType.BOOL:
        return bool(value)
    if vtype in (GGUFValueType.FLOAT32, GGUFValueType.FLOAT64):
        return float(value)
    return int(value)
