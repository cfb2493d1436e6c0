"""Open a GGUF file (memory-mapped, through gguf-py's reader) with errors a user can act on.

The reader raises bare ValueError/IndexError on damaged files; we check the magic ourselves, turn
every parse failure into a ModelFileError, and check that each tensor's bytes lie inside the file
(a truncated download otherwise shows up much later as a reshape error or garbage weights).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType

from ..errors import ModelFileError

GGUF_MAGIC = b"GGUF"


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
        if not self.path.is_file():
            raise ModelFileError(f"{self.path}: no such file")
        self.file_size = self.path.stat().st_size
        with open(self.path, "rb") as f:
            magic = f.read(4)
        if magic != GGUF_MAGIC:
            raise ModelFileError(f"{self.path}: not a GGUF file (starts with {magic!r}, expected b'GGUF')")
        try:
            self._reader = GGUFReader(self.path, "r")
        except (ValueError, IndexError, KeyError, OverflowError, UnicodeDecodeError) as e:
            raise ModelFileError(f"{self.path}: damaged or truncated GGUF header ({e})") from None
        self.metadata: dict[str, object] = {
            name: _field_value(field) for name, field in self._reader.fields.items()
            if not name.startswith("GGUF.")
        }
        self.tensors: dict[str, TensorInfo] = {}
        for t in self._reader.tensors:
            info = TensorInfo(t.name, GGMLQuantizationType(t.tensor_type),
                              tuple(int(x) for x in t.shape), int(t.n_bytes), int(t.data_offset))
            if info.offset + info.n_bytes > self.file_size:
                raise ModelFileError(
                    f"{self.path}: truncated: tensor {info.name} needs bytes up to "
                    f"{info.offset + info.n_bytes:,} but the file has {self.file_size:,} "
                    f"(an interrupted download? fetch it again)")
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
