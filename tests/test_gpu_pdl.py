"""Programmatic dependent launch (native/src/pdl.cuh, OPENJET_PDL=1) changes when kernels start, never what
they compute: the engine's outputs with it must equal those without it bit for bit. Each side runs in its own
process (the switch is read once per process): a prefill of 300 tokens in chunks of 128, then decode steps
of T = 1..8, then a verify step of 5 with accept 3, one more decode step and 3 MTP drafts (which read the
cache rows every step fills), on the `small` synthetic model with f16 and q8_0 KV. A missing pdl_wait() in a
kernel shows up here as a race: differing logits. The same harness checks the cluster packs (the default on
sm_90+, OPENJET_PACK_CLUSTER=0 turns them off; native/src/elementwise.cu: a decode row's pack split over a cluster
of blocks).
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from gpu_report import report
from openjet_launcher.model.synth import synthesize

pytestmark = pytest.mark.gpu

RUN = r"""
import sys
import numpy as np
from openjet_launcher.engine.cuda import CudaEngine
eng = CudaEngine.load(sys.argv[1], n_ctx=1024, kv_type=sys.argv[2])
rng = np.random.default_rng(7)
V = eng.config.shape.n_vocab
st = eng.new_state()
out = [eng.prefill(st, rng.integers(0, V, 300).tolist(), chunk_size=128).logits]
for t in range(1, 9):
    out.append(eng.decode(st, rng.integers(0, V, t).tolist()).logits)
out.append(eng.verify(st, rng.integers(0, V, 5).tolist()).logits)
eng.accept(st, 3)
out.append(eng.decode(st, rng.integers(0, V, 2).tolist()).logits)
out.append(eng.mtp_draft(st, int(rng.integers(0, V)), n_draft=3).logits)  # the MTP head's cache rows too
np.save(sys.argv[3], np.concatenate([np.asarray(o, np.float32).ravel() for o in out]))
from openjet_launcher.engine import kernels_test as kt
print(kt.launch_count("pack_cluster"))
"""


@pytest.fixture(scope="module")
def small_model(tmp_path_factory):
    path = tmp_path_factory.mktemp("pdl") / "small.gguf"
    synthesize("small", path, show_progress=False)
    return path


def run_engine(model, kv: str, pdl: bool, out, **env_more: str) -> np.ndarray:
    return run_counted(model, kv, pdl, out, **env_more)[0]


def run_counted(model, kv: str, pdl: bool, out, **env_more: str) -> tuple[np.ndarray, int]:
    """The run's logits and its launches of the cluster packs (kernels_test.launch_count)."""
    env = dict(os.environ, OPENJET_PDL="1" if pdl else "0", **env_more)
    proc = subprocess.run([sys.executable, "-c", RUN, str(model), kv, str(out)], env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return np.load(out), int(proc.stdout.split()[-1])


@pytest.mark.parametrize("kv", ["f16", "q8_0"])
def test_pdl_keeps_every_bit(small_model, tmp_path, kv):
    plain = run_engine(small_model, kv, False, tmp_path / "plain.npy")
    pdl = run_engine(small_model, kv, True, tmp_path / "pdl.npy")
    assert plain.shape == pdl.shape and np.isfinite(plain).all()
    differ = int((plain.view(np.uint32) != pdl.view(np.uint32)).sum())
    assert differ == 0, f"{differ} of {plain.size} logits differ with OPENJET_PDL=1"


@pytest.mark.parametrize("kv", ["f16", "q8_0"])
def test_cluster_packs_keep_every_bit(small_model, tmp_path, kv):
    """The cluster packs against the one-block packs (OPENJET_PACK_CLUSTER=0): 1 (add-norm and swiglu packs) and the
    default (2: the mixers' output packs too). The small model's widths (1,024, 3,072, 1,536 and 2,048) are whole
    parts of 8 x 32 elements, so every decode pack of those kinds takes the cluster kernels; the launch counter shows
    they ran, more of them under the default (below sm_90 the library keeps the one-block kernels: nothing to
    compare, the test skips)."""
    from openjet_launcher.engine import probe_in_child

    if probe_in_child()["devices"][0]["sm"] < 90:
        pytest.skip("no thread-block clusters below sm_90: OPENJET_PACK_CLUSTER changes nothing there")
    plain, plain_count = run_counted(small_model, kv, True, tmp_path / "plain.npy", OPENJET_PACK_CLUSTER="0")
    clustered, count = run_counted(small_model, kv, True, tmp_path / "cluster.npy", OPENJET_PACK_CLUSTER="1")
    more, more_count = run_counted(small_model, kv, True, tmp_path / "more.npy")
    counts = (plain_count, count, more_count)
    assert plain_count == 0 < count < more_count, f"cluster pack launches under 0, 1, the default: {counts}"
    assert np.isfinite(plain).all()
    for name, got in (("1", clustered), ("default", more)):
        assert got.shape == plain.shape
        differ = int((plain.view(np.uint32) != got.view(np.uint32)).sum())
        report(test="cluster_packs_same_bits", kv=kv, setting=name, logits=int(plain.size), differ=differ)
        assert differ == 0, f"{differ} of {plain.size} logits differ between the cluster ({name}) and one-block packs"


def test_the_add_norm_packs_max_estimate_keeps_its_bits():
    """OPENJET_ADD_NORM_MAX_EST=1 (elementwise.cu add_norm_pack_cluster_kernel; switched here through
    kernels_test.set_add_norm_max_est, since a launch reads the environment once): the pack's scale from est =
    fl(s P), P = max fl(|h w|), where est pins the binade of the values' max (binade_pinned), else from the max as
    before. Against off (the max itself), every output bit equal: h after the add, the float copy, the pack's values,
    sums and 1 / s, at the 27B's width and the small model's, on random rows and on rows built so that est and the
    true max lie on two sides of a power of two (found by emulating the two rounding orders in float32 with the rms
    scale s the kernel itself gives, read back from its float copy): a guard that trusted est there would pack that
    row under twice or half the scale."""
    from openjet_launcher.engine import kernels_test as kt
    from openjet_launcher.engine import probe_in_child

    if probe_in_child()["devices"][0]["sm"] < 90:
        pytest.skip("the cluster add-norm pack runs on sm_90+ only")
    f32 = np.float32

    def bits(a: np.ndarray) -> bytes:  # (floats compared as bits: -0 against 0 and NaNs too)
        return a.tobytes()

    def both(h, d, w):
        out = {}
        for on in (False, True):
            kt.set_add_norm_max_est(on)
            try:
                out[on] = kt.add_norm_pack(h, d, w)
            finally:
                kt.set_add_norm_max_est(None)
        return out[False], out[True]

    def straddling_row(k, j0):
        """(h, w): ones, but h[j0] = x0 and w[j0] = w0 chosen so that fl(fl(x0 s) w0) and fl(s fl(x0 w0)) lie on two
        sides of 8, where s is the kernel's rms scale of the row (its float copy at an element of h = w = 1)."""
        for x0 in np.linspace(1.05, 3.0, 40, dtype=f32):
            h = np.ones((1, k), f32)
            h[0, j0] = x0
            s = kt.add_norm_pack(h, None, np.ones(k, f32))[1][0, (j0 + 1) % k]  # fl(1 s) = s
            w0 = f32(8.0) / (x0 * s)
            for _ in range(64):  # from 64 ulps below 8 / (x0 s) to 64 above
                w0 = np.nextafter(w0, f32(0.0), dtype=f32)
            for _ in range(129):
                w0 = np.nextafter(w0, f32(np.inf), dtype=f32)
                y0 = f32(f32(x0 * s) * w0)
                est = f32(s * f32(x0 * w0))
                if (y0 < 8.0) != (est < 8.0):
                    w = np.ones(k, f32)
                    w[j0] = w0
                    return h, w
        return None

    rng = np.random.default_rng(11)
    for k in (5120, 1024):
        for t in (1, 3):
            h = rng.standard_normal((t, k), dtype=f32) * f32(3.0)
            d = rng.standard_normal((t, k), dtype=f32)
            w = (rng.random(k, dtype=f32) + f32(0.5)) * np.where(rng.random(k) < 0.01, f32(20.0), f32(1.0))
            base, est = both(h, d, w)
            for name, a, b in zip(("h", "a", "xh", "xsum", "xinv"), base, est):
                assert bits(a) == bits(b), (k, t, name)
        found = straddling_row(k, 37)
        assert found is not None, "no straddling row found: the search needs widening"
        h, w = found
        base, est = both(h, None, w)
        report(test="add_norm_max_est", k=k, xinv=float(base[4][0]), est_xinv=float(est[4][0]))
        for name, a, b in zip(("h", "a", "xh", "xsum", "xinv"), base, est):
            assert bits(a) == bits(b), (k, "straddling", name)
