"""Re-encode the four tensor roles where a plain llama-quantize Q4_K_M file differs from unsloth's recipe.

A plain file stores ssm_out, ssm_alpha, ssm_beta and nextn.eh_proj as Q4_K; our kernels are built for the unsloth
types (Q5_K, F32, F32, Q8_0: recipe.PLAIN_CONVERSIONS). Dequantising the Q4_K blocks is exact, so the converted
tensor holds the same weights up to the target type's rounding (none for F32). One task per tensor, in threads:
numpy's codecs spend most of their time outside the GIL.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from gguf import GGMLQuantizationType as Q

from ..errors import ModelFileError
from . import quants
from .gguf_file import GGUFFile


def reencode(gguf: GGUFFile, conversions: list[tuple[str, str, str]],
             workers: int | None = None) -> dict[str, tuple[Q, np.ndarray]]:
    """{tensor name: (new type, encoded bytes uint8 [rows, row_bytes])} for the (name, from, to) conversions that
    ``recipe.classify`` lists for a plain Q4_K_M file."""
    def one(conv: tuple[str, str, str]) -> tuple[str, tuple[Q, np.ndarray]]:
        name, old, new = conv
        info = gguf.tensors[name]
        values = quants.dequantize(gguf.raw(name), Q[old]).reshape(info.rows, info.ne[0])
        target = Q[new]
        try:
            encoded = quants.quantize(values, target)
        except ValueError as e:                   # NaN, infinity or out-of-range weights in the file
            raise ModelFileError(f"{gguf.path.name}: tensor {name}: cannot convert {old} to {new} ({e}); "
                                 f"the file's weights are damaged: fetch it again") from None
        return name, (target, np.ascontiguousarray(encoded))

    with ThreadPoolExecutor(workers or min(8, os.cpu_count() or 1)) as pool:
        return dict(pool.map(one, conversions))
