"""Where the persistent FFN puts its pack rows, and what it allocates (ffn_persistent.cuh; no GPU needed: host
arithmetic of the library).

The kernel writes pack rows in one launch that other SMs read later in the same launch through their L1 (`__ldg`), and
L1s are not coherent within a launch (docs/MEGAKERNEL.md, step 2): each row group it writes after another group was
read must share no 128-byte line with that group in the activations and their 32-block sums, and no entry of `inv`
(read from L2) with any other group. The oracle is act_pack.cuh's addressing, re-derived here: rows r0.. of width k
(ActPack::from_row) lie at h + r0 k halves, sum + r0 (k / 32) 2 halves and inv + r0 floats.
"""

from __future__ import annotations

import pytest

from openjet_launcher.engine import kernels_test as kt
from openjet_launcher.engine.cuda import PREFILL_ROWS
from openjet_launcher.errors import OpenJetError
from openjet_launcher.launcher.memory import V1_FFN_PROFILE_SLOTS, memory_model
from openjet_launcher.model.shape import PRESETS

ROWS = 8     # kActRows: a row group (a decode step's token rows)
LINE = 128   # bytes of an L1 line

# (name, n_embd, n_ff, k_out): the presets' GDN (d_inner) and attention (q_dim) tails, and shapes at the limits
SHAPES = [(f"{name}-{mixer}", p.n_embd, p.n_ff, k) for name, p in PRESETS.items()
          for mixer, k in (("gdn", p.ssm_d_inner), ("attn", p.n_head * p.head_dim))]
SHAPES += [("narrow-tail", 1024, 1024, 256), ("wide-tail", 512, 768, 4096), ("n_ff-is-n_embd", 2048, 2048, 2048),
           ("tail-rows-before-next", 1280, 1280, 1024)]  # the next rows' bytes past the tail's, their inv rows not


pytestmark = pytest.mark.usefixtures("engine_library")


def groups(n_embd: int, n_ff: int, k_out: int, next_proj: bool) -> dict[str, dict[str, tuple[int, int]]]:
    """Each row group's byte intervals [start, end) in the pack's three arrays."""
    tail_row0, next_row0 = kt.ffn_pack_rows(n_embd, n_ff, k_out, next_proj)
    rows = {"norm": (0, n_embd), "swiglu": (ROWS, n_ff)}
    if k_out:
        rows["tail"] = (tail_row0, k_out)
    if next_proj:
        rows["next"] = (next_row0, n_embd)
    return {name: {"h": (2 * r0 * k, 2 * (r0 + ROWS) * k),
                   "sum": (2 * r0 * (k // 32) * 2, 2 * (r0 + ROWS) * (k // 32) * 2),
                   "inv": (4 * r0, 4 * (r0 + ROWS))}
            for name, (r0, k) in rows.items()}


def lines(span: tuple[int, int]) -> set[int]:
    return set(range(span[0] // LINE, (span[1] - 1) // LINE + 1))


@pytest.mark.parametrize("name, n_embd, n_ff, k_out", SHAPES, ids=[s[0] for s in SHAPES])
@pytest.mark.parametrize("next_proj", [False, True], ids=["no-next", "next"])
def test_the_pack_row_groups_share_no_line_the_kernel_could_read_stale(name, n_embd, n_ff, k_out, next_proj):
    g = groups(n_embd, n_ff, k_out, next_proj)
    names = list(g)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            for array in ("h", "sum"):
                shared = lines(g[a][array]) & lines(g[b][array])
                assert not shared, f"{name}: {a} and {b} share {len(shared)} lines of {array}"
            (a0, a1), (b0, b1) = g[a]["inv"], g[b]["inv"]
            assert a1 <= b0 or b1 <= a0, f"{name}: {a} and {b} overlap in inv"


@pytest.mark.parametrize("name, n_embd, n_ff, k_out", SHAPES[:2 * len(PRESETS)],
                         ids=[s[0] for s in SHAPES[:2 * len(PRESETS)]])
def test_every_level_fits_the_default_pack(name, n_embd, n_ff, k_out):
    """The engine's pack holds PREFILL_ROWS rows of its widest width (engine.cu): with the default, every preset's
    tail and next-norm rows fit, so ffn_persistent_takes does not fall back for want of rows."""
    tail_row0, next_row0 = kt.ffn_pack_rows(n_embd, n_ff, k_out, True)
    widest = max(n_embd, n_ff, k_out)
    assert (tail_row0 + ROWS) * k_out <= PREFILL_ROWS * widest and tail_row0 + ROWS <= PREFILL_ROWS, name
    assert (next_row0 + ROWS) * n_embd <= PREFILL_ROWS * widest and next_row0 + ROWS <= PREFILL_ROWS, name
    assert tail_row0 % 32 == 0 and next_row0 % 32 == 0, "32-row boundaries: inv entries on lines of their own"


@pytest.mark.parametrize("preset", list(PRESETS))
def test_the_launchers_memory_plan_holds_what_the_engine_allocates_for_it(preset):
    """launcher/memory.py's arena parts for the persistent FFN (its counters and flags, its profile) against the
    library's own sizes (ffn_persistent.cuh), from which engine.cu allocates them."""
    ints, slots = kt.ffn_scratch(PRESETS[preset].n_ff)
    mm = memory_model(PRESETS[preset])
    assert mm.ffn_persistent_scratch_bytes == 4 * ints
    assert V1_FFN_PROFILE_SLOTS == slots


def test_without_a_tail_or_next_projections_nothing_moves():
    assert kt.ffn_pack_rows(1024, 3072, 0, False) == (-1, 0)


def test_widths_that_are_not_whole_units_are_refused():
    with pytest.raises(OpenJetError, match="multiples of 256"):
        kt.ffn_pack_rows(1000, 3072, 1536, True)
