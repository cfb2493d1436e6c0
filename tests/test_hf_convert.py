"""HF -> GGUF conversion of tiny `Qwen3_5ForCausalLM` models (spec §2.3, §5).

Oracles: transformers itself (its modules' outputs, computed from the HF weights with HF's conventions,
compared with a few lines of numpy that use the GGUF tensors with the GGUF conventions: plain-w RMSNorm,
ssm_a used as is, key head = v mod n_k), and llama.cpp's own converter from the llama-cpp-python sdist.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import tarfile
from collections import Counter
from types import SimpleNamespace

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from openjet_launcher.errors import OpenJetError  # noqa: E402
from openjet_launcher.model import hf_convert as hc  # noqa: E402
from openjet_launcher.model import quants  # noqa: E402
from openjet_launcher.model.config import read_config  # noqa: E402
from openjet_launcher.model.gguf_file import GGUFFile  # noqa: E402
from openjet_launcher.model.inventory import expected_tensors  # noqa: E402
from openjet_launcher.model.recipe import MIXED, UNSLOTH_Q4_K_M, classify  # noqa: E402

N_TOKENS = 6  # forward-pass length: long enough for the causal conv window (4) and attention masking


@pytest.fixture(scope="module")
def tiny():
    model, mtp = hc.random_tiny_model(seed=0)
    original = {k: v.numpy().copy() for k, v in {**model.state_dict(), **mtp}.items()}
    return model, mtp, original


@pytest.fixture(scope="module", params=hc.RECIPES)
def converted(request, tiny, tmp_path_factory):
    """The tiny model written in one recipe: the file, its decoded tensors (float32, and float64 as W),
    the effective HF state dict, and an HF model that computes with it."""
    model, mtp, _ = tiny
    path = tmp_path_factory.mktemp("hf") / f"tiny-{request.param}.gguf"
    effective = hc.hf_to_gguf(model, model.config, path, recipe=request.param, mtp_state=mtp)
    hf = copy.deepcopy(model)
    hc.load_hf_state(hf, effective)
    tensors = read_tensors(path)
    return SimpleNamespace(recipe=request.param, path=path, effective=effective, hf=hf, tensors=tensors,
                           W={k: v.astype(np.float64) for k, v in tensors.items()},
                           shape=read_config(GGUFFile(path)).shape)


def read_tensors(path) -> dict[str, np.ndarray]:
    """Every tensor of a GGUF file decoded to float32, numpy view (ne reversed)."""
    g = GGUFFile(path)
    return {n: quants.dequantize(g.raw(n), i.qtype).reshape(tuple(reversed(i.ne))) for n, i in g.tensors.items()}


# ------------------------------------------------------------------------------------ file and census

def test_converted_file_reads_as_qwen35_with_the_recipe_types(converted, tiny):
    recipe, model = converted.recipe, tiny[0]
    g = GGUFFile(converted.path)
    config = read_config(g)
    shape = hc.shape_from_hf(model.config, with_mtp=True)
    assert config.shape == shape and config.has_mtp and config.warnings == ()
    assert g.metadata["qwen35.block_count"] == model.config.num_hidden_layers + 1
    assert g.metadata["qwen35.nextn_predict_layers"] == 1
    want = hc.recipe_types(shape, recipe)
    assert [(n, i.ne, i.qtype) for n, i in g.tensors.items()] == [(s.name, s.ne, t) for s, t in want]
    verdict = classify(g, config)
    if recipe == "unsloth":
        assert verdict.kind == UNSLOTH_Q4_K_M and verdict.runnable
        assert verdict.census == {"F32": 36, "Q4_K": 26, "Q5_K": 3, "Q6_K": 5, "Q8_0": 1}
    else:
        assert verdict.kind == MIXED and verdict.census == {"F32": len(want)}


def test_without_mtp_head_the_file_has_no_nextn_block(tiny, tmp_path):
    model = tiny[0]
    path = tmp_path / "no-mtp.gguf"
    effective = hc.hf_to_gguf(model, model.config, path)
    g = GGUFFile(path)
    config = read_config(g)
    assert not config.has_mtp and g.metadata["qwen35.nextn_predict_layers"] == 0
    assert g.metadata["qwen35.block_count"] == config.shape.n_layer == 4
    assert list(g.tensors) == [s.name for s in expected_tensors(config.shape, with_mtp=False)]
    assert not any(k.startswith("mtp.") for k in effective)


def test_a_config_outside_the_family_is_refused():
    with pytest.raises(OpenJetError, match="head_dim is 128, expected 256"):
        hc.shape_from_hf(hc.tiny_hf_config(head_dim=128), with_mtp=False)


# ------------------------------------------------------------------------------- inverse and exactness

def test_gguf_tensors_map_back_to_the_effective_hf_state(converted, tiny):
    recipe, effective, shape, original = converted.recipe, converted.effective, converted.shape, tiny[2]
    back = hc.to_hf_tensors(converted.tensors, shape)
    assert back.keys() == effective.keys() == original.keys()
    for k in back:
        assert back[k].dtype == np.float32 and np.array_equal(back[k], effective[k]), k
    types = {hc.hf_name(s.name, shape.n_layer): t for s, t in hc.recipe_types(shape, recipe)}
    for k in original:                      # F32 tensors bit-exact; quantised ones close but not equal
        if types[k].name == "F32":
            assert np.array_equal(effective[k], original[k]), k
        else:
            err = np.abs(effective[k] - original[k]).max() / np.abs(original[k]).max()
            assert 0 < err < 0.1, (k, err)


def test_transformers_computes_the_files_norms_and_decay_bit_for_bit(converted):
    """HF evaluates 1 + w and -exp(A_log); with the effective state these equal the file's F32 values."""
    t, s = converted.tensors, converted.shape
    params = dict(converted.hf.named_parameters())
    norms = [n for n in t if n.endswith("norm.weight") and not n.endswith("ssm_norm.weight")]
    for name in norms:
        hf = hc.hf_name(name, s.n_layer)
        w = params[hf].float() if hf in params else torch.from_numpy(converted.effective[hf])   # mtp.* norms
        assert torch.equal(1.0 + w, torch.tensor(t[name])), name
    n_k, r = s.ssm_n_k_heads, s.ssm_n_v_heads // s.ssm_n_k_heads
    hf_head = [r * (v % n_k) + v // n_k for v in range(s.ssm_n_v_heads)]
    gdn = [il for il in range(s.n_layer) if not s.is_attention_layer(il)]
    for il in gdn:
        decay = -params[f"model.layers.{il}.linear_attn.A_log"].float().exp()
        assert torch.equal(decay[hf_head], torch.tensor(t[f"blk.{il}.ssm_a"])), il
    # attn/post-attention norms of 5 blocks, q/k norms of 2 attention blocks, 3 nextn norms, output_norm
    assert len(norms) == 2 * 5 + 2 * 2 + 3 + 1 and len(gdn) == 3


def test_transforms_are_those_of_the_spec(tiny):
    """+1 norms (not ssm_norm), -exp(A_log), squeezed conv, grouped->tiled value heads, MTP names."""
    _, _, original = tiny
    shape = hc.shape_from_hf(tiny[0].config, with_mtp=True)
    t = hc.to_gguf_tensors(original, shape)
    o = original
    assert np.array_equal(t["blk.0.attn_norm.weight"], o["model.layers.0.input_layernorm.weight"] + 1)
    assert np.array_equal(t["blk.4.nextn.enorm.weight"], o["mtp.pre_fc_norm_embedding.weight"] + 1)
    assert np.array_equal(t["blk.0.ssm_norm.weight"], o["model.layers.0.linear_attn.norm.weight"])
    assert np.array_equal(t["blk.4.nextn.eh_proj.weight"], o["mtp.fc.weight"])
    assert np.array_equal(t["blk.3.attn_q.weight"], o["model.layers.3.self_attn.q_proj.weight"])
    # tiled head v' = 2*j + kh holds grouped head 3*kh + j (2 key heads, 3 value heads per key head)
    grouped_of = [3 * (v % 2) + v // 2 for v in range(6)]
    assert grouped_of == [0, 3, 1, 4, 2, 5]
    a_log = o["model.layers.0.linear_attn.A_log"]
    assert np.allclose(t["blk.0.ssm_a"], -np.exp(a_log[grouped_of]), rtol=1e-6)
    d, kd = 128, 2 * 256
    z, qkv = o["model.layers.0.linear_attn.in_proj_z.weight"], o["model.layers.0.linear_attn.in_proj_qkv.weight"]
    conv, out = o["model.layers.0.linear_attn.conv1d.weight"], o["model.layers.0.linear_attn.out_proj.weight"]
    for v, src in enumerate(grouped_of):
        head, src_head = slice(v * d, (v + 1) * d), slice(src * d, (src + 1) * d)
        v_head, v_src = slice(kd + v * d, kd + (v + 1) * d), slice(kd + src * d, kd + (src + 1) * d)
        assert np.array_equal(t["blk.0.attn_gate.weight"][head], z[src_head])
        assert np.array_equal(t["blk.0.attn_qkv.weight"][v_head], qkv[v_src])
        assert np.array_equal(t["blk.0.ssm_conv1d.weight"][v_head], conv[v_src, 0])
        assert np.array_equal(t["blk.0.ssm_out.weight"][:, head], out[:, src_head])
    assert np.array_equal(t["blk.0.attn_qkv.weight"][:kd], qkv[:kd])


# ---------------------------------------------------------------- independent check against transformers

def _rms(x, w, eps=1e-6):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def _silu(x):
    return x / (1 + np.exp(-x))


def _sigmoid(x):
    return 1 / (1 + np.exp(-x))


def _l2n(x):
    return x / np.sqrt((x * x).sum(-1, keepdims=True) + 1e-6)


def _gdn_gates(W, p, a):
    """z (T, n_v, d), beta and g (T, n_v) in GGUF head order."""
    z = a @ W[p + "attn_gate.weight"].T
    beta = _sigmoid(a @ W[p + "ssm_beta.weight"].T)
    x = a @ W[p + "ssm_alpha.weight"].T + W[p + "ssm_dt.bias"]
    g = W[p + "ssm_a"] * np.logaddexp(0, x)                    # ssm_a = -exp(A_log), used as is
    return z.reshape(len(a), beta.shape[1], -1), beta, g


def _gdn(W, p, a, s, pair=lambda v, n_k, r: v % n_k):
    """GDN mixer over tokens a (T, n_embd), GGUF conventions: value head v reads key head pair(v)."""
    T, n_k, n_v, d = len(a), s.ssm_n_k_heads, s.ssm_n_v_heads, s.ssm_head_dim
    qkv = a @ W[p + "attn_qkv.weight"].T
    w = W[p + "ssm_conv1d.weight"]                              # (channels, 4); tap 3 = current token
    x = np.vstack([np.zeros((3, qkv.shape[1])), qkv])
    u = _silu(sum(x[j:j + T] * w[:, j] for j in range(4)))
    q = _l2n(u[:, :n_k * d].reshape(T, n_k, d)) / np.sqrt(d)
    k = _l2n(u[:, n_k * d:2 * n_k * d].reshape(T, n_k, d))
    v = u[:, 2 * n_k * d:].reshape(T, n_v, d)
    z, beta, g = _gdn_gates(W, p, a)
    kh = np.array([pair(i, n_k, n_v // n_k) for i in range(n_v)])
    S, o = np.zeros((n_v, d, d)), np.zeros((T, n_v, d))
    for t in range(T):
        S *= np.exp(g[t])[:, None, None]
        delta = beta[t][:, None] * (v[t] - np.einsum("hkv,hk->hv", S, k[t, kh]))
        S += np.einsum("hk,hv->hkv", k[t, kh], delta)
        o[t] = np.einsum("hkv,hk->hv", S, q[t, kh])
    y = _rms(o, W[p + "ssm_norm.weight"]) * _silu(z)
    return y.reshape(T, -1) @ W[p + "ssm_out.weight"].T


def _rope(x, s):
    """NeoX rotation of the first n_rot dims, pairs (i, i + n_rot/2); text positions 0..T-1."""
    half = s.n_rot // 2
    ang = np.arange(len(x))[:, None] * s.rope_base ** (-np.arange(half) / half)
    cos, sin = np.cos(ang)[:, None], np.sin(ang)[:, None]
    x1, x2 = x[..., :half], x[..., half:s.n_rot]
    return np.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos, x[..., s.n_rot:]], -1)


def _attention(W, p, a, s):
    T, hd = len(a), s.head_dim
    qg = (a @ W[p + "attn_q.weight"].T).reshape(T, s.n_head, 2, hd)    # per head [query | gate]
    q = _rope(_rms(qg[:, :, 0], W[p + "attn_q_norm.weight"]), s)
    k = _rope(_rms((a @ W[p + "attn_k.weight"].T).reshape(T, s.n_head_kv, hd), W[p + "attn_k_norm.weight"]), s)
    v = (a @ W[p + "attn_v.weight"].T).reshape(T, s.n_head_kv, hd)
    kv = np.arange(s.n_head) // (s.n_head // s.n_head_kv)
    scores = np.einsum("thd,shd->hts", q, k[:, kv]) / np.sqrt(hd) + np.triu(np.full((T, T), -np.inf), 1)
    prob = np.exp(scores - scores.max(-1, keepdims=True))
    prob /= prob.sum(-1, keepdims=True)
    o = np.einsum("hts,shd->thd", prob, v[:, kv]).reshape(T, -1) * _sigmoid(qg[:, :, 1].reshape(T, -1))
    return o @ W[p + "attn_output.weight"].T


def _layer(W, il, h, s):
    p = f"blk.{il}."
    a = _rms(h, W[p + "attn_norm.weight"])
    h = h + (_attention(W, p, a, s) if s.is_attention_layer(il) else _gdn(W, p, a, s))
    f = _rms(h, W[p + "post_attention_norm.weight"])
    return h + (_silu(f @ W[p + "ffn_gate.weight"].T) * (f @ W[p + "ffn_up.weight"].T)) @ W[p + "ffn_down.weight"].T


def _rel(got, want):
    return float(np.abs(got - want).max() / np.abs(want).max())


def _hf_forward(hf, ids):
    """HF logits and each decoder layer's (input, output), captured by hooks."""
    io = {}

    def hook(i):
        return lambda m, args, kwargs, out: io.__setitem__(i, (args[0][0].double().numpy(), out[0].double().numpy()))

    handles = [layer.register_forward_hook(hook(i), with_kwargs=True) for i, layer in enumerate(hf.model.layers)]
    try:
        with torch.no_grad():
            logits = hf(torch.tensor([ids])).logits[0].double().numpy()
    finally:
        for handle in handles:
            handle.remove()
    return logits, io


def test_every_layer_and_the_logits_match_transformers(converted):
    """GGUF tensors with GGUF conventions (numpy, float64) reproduce HF's per-layer outputs and logits."""
    W, s = converted.W, converted.shape
    ids = np.random.default_rng(1).integers(0, s.n_vocab, N_TOKENS)
    logits, io = _hf_forward(converted.hf, ids.tolist())
    assert np.array_equal(io[0][0], W["token_embd.weight"][ids])
    for il in range(s.n_layer):
        h_in, h_out = io[il]
        assert _rel(_layer(W, il, h_in, s), h_out) < 1e-5, il
    h = _rms(io[s.n_layer - 1][1], W["output_norm.weight"])
    assert _rel(h @ W["output.weight"].T, logits) < 1e-5
    assert logits.std() > 0.5                                    # not a degenerate model


def test_gdn_gates_and_pairing_match_transformers_per_value_head(converted):
    """z, beta and g of GGUF head v' equal HF's for grouped head 3*(v' mod 2) + v' div 3; the mixer output
    matches only with the tiled pairing (key head v mod n_k), not with the grouped one (v div r)."""
    W, s = converted.W, converted.shape
    la = converted.hf.model.layers[0].linear_attn
    x = torch.randn(1, N_TOKENS, s.n_embd, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        z_hf = la.in_proj_z(x)[0].reshape(N_TOKENS, s.ssm_n_v_heads, -1).double().numpy()
        beta_hf = la.in_proj_b(x)[0].sigmoid().double().numpy()
        g_hf = -la.A_log.float().exp() * torch.nn.functional.softplus(la.in_proj_a(x)[0] + la.dt_bias)
        g_hf = g_hf.double().numpy()
        out_hf = la(x)[0].double().numpy()
    a = x[0].double().numpy()
    z, beta, g = _gdn_gates(W, "blk.0.", a)
    n_k, r = s.ssm_n_k_heads, s.ssm_n_v_heads // s.ssm_n_k_heads
    hf_head = [r * (v % n_k) + v // n_k for v in range(s.ssm_n_v_heads)]
    assert _rel(z, z_hf[:, hf_head]) < 1e-5
    assert _rel(beta, beta_hf[:, hf_head]) < 1e-5
    assert _rel(g, g_hf[:, hf_head]) < 1e-5
    assert _rel(_gdn(W, "blk.0.", a, s), out_hf) < 1e-5
    assert _rel(_gdn(W, "blk.0.", a, s, pair=lambda v, n_k, r: v // r), out_hf) > 1e-2


# ---------------------------------------------------------------------- llama.cpp's own converter agrees

@pytest.mark.slow
def test_llama_cpp_converter_writes_the_same_tensors(tiny, tmp_path):
    """convert_hf_to_gguf.py (llama-cpp-python 0.3.36 sdist) on the saved HF directory, --outtype f32."""
    from safetensors.torch import save_file

    from openjet_launcher.model.sdist import SdistError, llama_cpp_sdist

    try:
        sdist = llama_cpp_sdist()
    except SdistError as e:
        pytest.skip(f"llama-cpp-python sdist unavailable: {e}")
    model, mtp, _ = tiny
    with tarfile.open(sdist, "r:gz") as tar:
        top = tar.getmembers()[0].name.split("/")[0] + "/vendor/llama.cpp/"
        wanted = [m for m in tar.getmembers() if m.name == top + "convert_hf_to_gguf.py"
                  or m.name.startswith((top + "conversion/", top + "gguf-py/"))]
        tar.extractall(tmp_path / "sdist", members=wanted, filter="data")
    root = tmp_path / "sdist" / top

    hf_dir = tmp_path / "hf"
    hf_dir.mkdir()
    save_file({k: v.contiguous() for k, v in {**model.state_dict(), **mtp}.items()}, hf_dir / "model.safetensors",
              metadata={"format": "pt"})
    cfg = model.config.to_dict() | {"architectures": ["Qwen3_5ForCausalLM"], "mtp_num_hidden_layers": 1}
    (hf_dir / "config.json").write_text(json.dumps(cfg))
    driver = (  # tensors only: the directory has no tokenizer, so the vocabulary step is skipped
        "import runpy, sys; sys.path.insert(0, sys.argv[1]); import conversion.qwen as q; "
        "q.Qwen3_5TextModel.set_vocab = lambda self: None; "
        "sys.argv = [sys.argv[1] + '/convert_hf_to_gguf.py'] + sys.argv[2:]; "
        "runpy.run_path(sys.argv[0], run_name='__main__')")
    theirs, ours = tmp_path / "llama.cpp.gguf", tmp_path / "ours.gguf"
    run = subprocess.run([sys.executable, "-c", driver, str(root), str(hf_dir), "--outtype", "f32",
                          "--outfile", str(theirs)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    hc.hf_to_gguf(model, model.config, ours, recipe="f32", mtp_state=mtp)

    a, b = GGUFFile(theirs), GGUFFile(ours)
    assert sorted(a.tensors) == sorted(b.tensors)
    for name, info in a.tensors.items():
        assert (info.ne, info.qtype) == (b.tensors[name].ne, b.tensors[name].qtype), name
        assert np.array_equal(a.raw(name), b.raw(name)), name
    differing = {k for k in a.metadata.keys() & b.metadata.keys()
                 if k.startswith("qwen35.") and a.metadata[k] != b.metadata[k]}
    assert not differing
    assert Counter(k for k in a.metadata.keys() - b.metadata.keys() if k.startswith("qwen35.")) == \
        Counter({"qwen35.attention.recurrent_layers": 1})   # optional; ours leaves it to the interval rule
