"""Which block the prefill's tf32x3 F32 GEMM (prefill_f32.cu: a GDN layer's beta and alpha) takes on each GPU (host
arithmetic of the library, no GPU needed): 48 W rows a block where the call gives every multiprocessor a block and
the block's shared memory fits, else 16 (the same bits either way; tests/test_gpu_gemv.py holds them equal).

The oracle re-derives the wide block's shared memory from its layout: 4 cp.async stages, each the chunk's 32 x rows
and 48 W rows of 64 floats padded to 80, 4 bytes a float: 102,400 bytes, more than the 99 KB (101,376) a block of
sm_86 / 89 / 120 may opt in to, within sm_90's 227 KB (232,448)."""

from __future__ import annotations

import math

import pytest

from openjet_launcher.engine import kernels_test as kt
from openjet_launcher.errors import OpenJetError

WIDE_SMEM = 4 * (32 + 48) * (64 + 16) * 4
OPTIN_SM90, OPTIN_CONSUMER = 232_448, 101_376
GPUS = {"H200": (132, OPTIN_SM90), "H100 PCIe": (114, OPTIN_SM90), "RTX 3090": (82, OPTIN_CONSUMER),
        "RTX 4090": (128, OPTIN_CONSUMER), "RTX 5090": (170, OPTIN_CONSUMER)}


pytestmark = pytest.mark.usefixtures("engine_library")


def expected(t: int, n: int, matrices: int, sms: int, optin: int) -> int:
    blocks = math.ceil(t / 32) * math.ceil(n / 48) * matrices
    return 48 if blocks >= sms and WIDE_SMEM <= optin else 16


@pytest.mark.parametrize("gpu", list(GPUS))
@pytest.mark.parametrize("t", [1, 50, 300, 2048, 4096, 8192])
@pytest.mark.parametrize("matrices", [1, 2])
def test_the_block_follows_the_grid_and_the_shared_memory(gpu, t, matrices):
    sms, optin = GPUS[gpu]
    assert kt.prefill_f32_block_rows(t, 48, matrices, sms, optin) == expected(t, 48, matrices, sms, optin)


def test_the_cases_that_matter():
    """The H200's 4,096-row chunk of the 27B takes wide blocks (256 for 132 SMs), its 2,048-row one narrow (128);
    a 4090's 2,048-row chunk would fill its 128 SMs with wide blocks, but they do not fit its 99 KB: narrow."""
    assert kt.prefill_f32_block_rows(4096, 48, 2, *GPUS["H200"]) == 48
    assert kt.prefill_f32_block_rows(2048, 48, 2, *GPUS["H200"]) == 16
    assert kt.prefill_f32_block_rows(2048, 48, 2, *GPUS["RTX 4090"]) == 16
    assert kt.prefill_f32_block_rows(2048, 48, 2, 128, WIDE_SMEM) == 48  # exactly enough shared memory
    assert kt.prefill_f32_block_rows(2048, 48, 2, 128, WIDE_SMEM - 1) == 16


@pytest.mark.parametrize("args", [(0, 48, 2, 132, OPTIN_SM90), (4096, 0, 2, 132, OPTIN_SM90),
                                  (4096, 48, 3, 132, OPTIN_SM90), (4096, 48, 2, 0, OPTIN_SM90),
                                  (4096, 48, 2, 132, -1)])
def test_bad_arguments_are_refused(args):
    with pytest.raises(OpenJetError, match="prefill_f32_block_rows"):
        kt.prefill_f32_block_rows(*args)
