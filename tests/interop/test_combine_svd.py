"""`peftc adapter combine` with PEFT's SVD combination types against PEFT's own `add_weighted_adapter`:
svd, ties_svd, dare_linear_svd, dare_ties_svd, magnitude_prune_svd, with svd_rank and svd_clamp.

The SVD of the combined delta is unique up to the sign of each singular-vector pair (for distinct singular
values), and only its rounding depends on the LAPACK that computes it. peft_c fixes the signs (the largest
magnitude of each lora_B column is positive); PEFT gets whatever torch's LAPACK gives. So the tests compare:

* the merged deltas B @ A, which do not depend on the signs, within 1e-5 of their norm (f32 rounding of two
  different SVD computations);
* the factors themselves, with PEFT's torch.linalg.svd given the same sign rule (a wrapper that flips its
  output pairs, nothing else), within 1e-4 of their largest value; this is also what makes svd_clamp's
  quantile comparable;
* against the exact weighted delta: a rank that holds it gives it back (rank-sum), and a smaller one gives the
  optimal truncation error sqrt(sum of the dropped squared singular values), computed by torch in f64;
* DARE's random masks: PEFT is given peft_c's masks of the deltas (factor 2 of the formula in
  include/peft_c.h), as in the pruning tests of test_adapter_export.py.

And the case that motivated the delta-space types: PEFT's factor-wise "linear" of two adapters differs from
their weighted delta (cross terms), while "svd" at the summed rank equals it; both numbers are asserted.

Environment: PEFTC (the peftc binary), PEFT_TEST_DATA (see conftest.py).
"""
from __future__ import annotations

import json
import math
import os
import pathlib
import subprocess

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")
from peft import LoraConfig, PeftModel  # noqa: E402
from peft.tuners.lora import LoraLayer  # noqa: E402

from merge_support import dare_keep  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[2]
FIXTURES = pathlib.Path(os.environ.get("PEFT_TEST_DATA") or REPO / "tests" / "fixtures")
ADAPTERS = FIXTURES / "adapters"
LLAMA = FIXTURES / "models" / "llama"


def run(peftc, *args, ok=True):
    result = subprocess.run([str(peftc), *map(str, args)], capture_output=True, text=True)
    if ok:
        assert result.returncode == 0, result.stderr
    return result


def load_base(base: pathlib.Path):
    architecture = json.loads((base / "config.json").read_text())["architectures"][0]
    return getattr(transformers, architecture).from_pretrained(base, dtype="auto").eval()


def base_of(adapter: pathlib.Path) -> pathlib.Path:
    manifest = json.loads((ADAPTERS / "MANIFEST.json").read_text())
    return FIXTURES / manifest[adapter.name]["base"] if adapter.name in manifest else LLAMA


def factors(layer, name):
    if name in layer.lora_A:
        return layer.lora_A[name].weight.detach(), layer.lora_B[name].weight.detach()
    return layer.lora_embedding_A[name].detach(), layer.lora_embedding_B[name].detach()


def matrix(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(t.shape[0], -1).double()


def product(a, b) -> torch.Tensor:
    return matrix(b) @ matrix(a)


def layers(model, name):
    return {n.removeprefix("base_model.model."): m for n, m in model.named_modules()
            if isinstance(m, LoraLayer) and (name in m.lora_A or name in m.lora_embedding_A)}


def dare_mask(seed: int, module: str, adapter: int, factor: int, shape, density: float) -> torch.Tensor:
    keep = dare_keep(seed, module, adapter, factor, math.prod(shape), density)
    return torch.tensor(keep, dtype=torch.float32).reshape(shape)


def signed_svd(original):
    """torch.linalg.svd with peft_c's sign rule: each column of U (so of U @ diag(S)) has its largest
    magnitude (the first of equal ones) positive; the matching row of Vh flips with it."""
    def svd(x, *args, **kwargs):
        u, s, vh = original(x, *args, **kwargs)
        k = s.shape[-1]
        at = u[:, :k].abs().argmax(dim=0)
        signs = torch.where(u[at, torch.arange(k)] < 0, -1.0, 1.0).to(u.dtype)
        u = u.clone()
        vh = vh.clone()
        u[:, :k] *= signs
        vh[:k, :] *= signs[:, None]
        return u, s, vh
    return svd


def peft_combination(dirs, weights, how, base, monkeypatch, *, same_signs=True, masks=None, **settings):
    model = PeftModel.from_pretrained(load_base(base), dirs[0], adapter_name="a0").eval()
    for i, d in enumerate(dirs[1:], start=1):
        model.load_adapter(d, adapter_name=f"a{i}")
    with monkeypatch.context() as patch:
        if same_signs:
            patch.setattr(torch.linalg, "svd", signed_svd(torch.linalg.svd))
        if masks is not None:
            def bernoulli(p, *a, **k):
                mask = masks.pop(0)
                assert mask.shape == p.shape
                return mask
            patch.setattr(torch, "bernoulli", bernoulli)
        model.add_weighted_adapter([f"a{i}" for i in range(len(dirs))], weights, "combined", combination_type=how,
                                   **settings)
    if masks is not None:
        assert not masks  # every mask was asked for
    model.set_adapter("combined")
    return model


def combine(peftc, dirs, weights, how, out, *options):
    args = ["adapter", "combine", "--method", how, "--out", out, *options]
    for d, w in zip(dirs, weights):
        args += ["--adapter", f"{d}:{w!r}"]
    run(peftc, *args)
    return PeftModel.from_pretrained(load_base(base_of(dirs[0])), out).eval()


def deltas_of_inputs(dirs, weights, base):
    """The exact weighted delta sum_i w_i s_i B_i A_i of each module, in f64 ([out, in] as the factors)."""
    model = PeftModel.from_pretrained(load_base(base), dirs[0], adapter_name="a0").eval()
    for i, d in enumerate(dirs[1:], start=1):
        model.load_adapter(d, adapter_name=f"a{i}")
    exact = {}
    for name, layer in layers(model, "a0").items():
        total = 0
        for i, w in enumerate(weights):
            if f"a{i}" in layer.lora_A or f"a{i}" in layer.lora_embedding_A:
                a, b = factors(layer, f"a{i}")
                total = total + w * layer.scaling[f"a{i}"] * product(a, b)
        exact[name] = total
    return exact


def compare(ours, reference, *, factors_too=True):
    ours_layers, ref_layers = layers(ours, "default"), layers(reference, "combined")
    assert set(ours_layers) == set(ref_layers) and ours_layers
    for name, layer in ours_layers.items():
        ref = ref_layers[name]
        assert layer.scaling["default"] == ref.scaling["combined"], name
        a, b = factors(layer, "default")
        ra, rb = factors(ref, "combined")
        assert a.shape == ra.shape and b.shape == rb.shape, name
        d, rd = product(a, b), product(ra, rb)
        assert torch.linalg.norm(d - rd) <= 1e-5 * torch.linalg.norm(rd) + 1e-12, name
        if factors_too:
            # The components whose singular value stands out of the rounding noise (a rank above the
            # delta's own leaves the others arbitrary): ||column k of B|| is the k-th singular value.
            a, b, ra, rb = matrix(a), matrix(b), matrix(ra), matrix(rb)
            singular = torch.linalg.norm(rb, dim=0)
            keep = singular > 1e-3 * singular.max()
            assert keep.any(), name
            for x, y in ((a[keep], ra[keep]), (b[:, keep], rb[:, keep])):
                assert (x - y).abs().max() <= 1e-4 * y.abs().max() + 1e-12, name


SVD_CASES = [
    # (adapters, weights, combination_type, peftc options, PEFT keywords)
    (["llama_lora", "llama_lora_second"], [0.7, -1.3], "svd", [], {}),
    (["llama_rank_alpha_pattern", "llama_lora"], [1.0, 0.5], "svd", [], {}),  # unequal ranks: r = 8
    (["llama_lora", "llama_lora_second"], [1.0, 0.5], "svd", ["--svd-rank", "2"], {"svd_rank": 2}),
    (["llama_lora", "llama_lora_second"], [0.7, -1.3], "svd", ["--svd-clamp", "0.9"], {"svd_clamp": 0.9}),
    (["llama_rslora", "llama_lora"], [1.0, 1.0], "svd", [], {}),  # use_rslora inherited, as PEFT
    (["gpt2_lora", "gpt2_lora"], [1.0, 0.5], "svd", [], {}),  # Conv1D: deltas [in, out]
    (["llama_lora", "llama_lora_second"], [0.7, -1.3], "ties_svd", ["--density", "0.5"], {"density": 0.5}),
    (["llama_lora", "llama_lora_second"], [1.0, 0.4], "ties_svd",
     ["--density", "0.3", "--majority-sign", "frequency", "--svd-rank", "3"],
     {"density": 0.3, "majority_sign_method": "frequency", "svd_rank": 3}),
    (["llama_lora", "llama_lora_second"], [0.7, -1.3], "magnitude_prune_svd", ["--density", "0.6"], {"density": 0.6}),
]


@pytest.mark.parametrize("names,weights,how,options,keywords", SVD_CASES,
                         ids=[f"{'+'.join(c[0])}-{c[2]}-{'_'.join(c[3]) or 'default'}" for c in SVD_CASES])
def test_svd_types_equal_add_weighted_adapter(names, weights, how, options, keywords, peftc_binary, tmp_path,
                                              monkeypatch):
    dirs = [ADAPTERS / n for n in names]
    base = base_of(dirs[0])
    ours = combine(peftc_binary, dirs, weights, how, tmp_path / "combined", *options)
    reference = peft_combination(dirs, weights, how, base, monkeypatch, **keywords)
    compare(ours, reference)
    # The config: r = lora_alpha = the new rank, as PEFT's.
    written = json.loads((tmp_path / "combined" / "adapter_config.json").read_text())
    expected = reference.peft_config["combined"]
    assert (written["r"], written["lora_alpha"]) == (expected.r, expected.lora_alpha)
    # Without the sign rule PEFT's factors may differ in sign, its deltas do not.
    unsigned = peft_combination(dirs, weights, how, base, monkeypatch, same_signs=False, **keywords)
    if "svd_clamp" not in keywords:
        compare(ours, unsigned, factors_too=False)
    with torch.no_grad():
        ids = torch.tensor([[1, 5, 7, 9, 11, 3, 2, 4]])
        got, want = ours(input_ids=ids).logits, reference(input_ids=ids).logits
    assert torch.allclose(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("how,density,sign", [("dare_linear_svd", 0.5, "total"), ("dare_ties_svd", 0.4, "frequency")])
def test_dare_svd_types_equal_add_weighted_adapter_with_the_same_masks(how, density, sign, peftc_binary, tmp_path,
                                                                       monkeypatch):
    seed = 424242
    dirs = [ADAPTERS / "llama_lora", ADAPTERS / "llama_lora_second"]
    weights = [0.8, -1.1]
    ours = combine(peftc_binary, dirs, weights, how, tmp_path / "combined", "--density", repr(density),
                   "--majority-sign", sign, "--seed", str(seed))
    # The masks PEFT asks for, in its order: per module (named_modules order), each adapter's delta in
    # get_delta_weight's layout.
    probe = PeftModel.from_pretrained(load_base(LLAMA), dirs[0], adapter_name="a0")
    probe.load_adapter(dirs[1], adapter_name="a1")
    masks = []
    for name, layer in layers(probe, "a0").items():
        for i in range(2):
            shape = tuple(layer.get_delta_weight(f"a{i}").shape)
            masks.append(dare_mask(seed, name, i, 2, shape, density))
    reference = peft_combination(dirs, weights, how, LLAMA, monkeypatch, masks=masks, density=density,
                                 majority_sign_method=sign)
    compare(ours, reference)


def test_exact_and_truncated_against_the_true_weighted_delta(peftc_binary, tmp_path, monkeypatch):
    """svd at the summed rank gives the weighted delta back; PEFT's factor-wise linear does not (cross
    terms); a smaller rank has the optimal truncation error."""
    dirs = [ADAPTERS / "llama_lora", ADAPTERS / "llama_lora_second"]
    weights = [0.7, -1.3]
    exact = deltas_of_inputs(dirs, weights, LLAMA)
    worst_svd, worst_linear = 0.0, 0.0
    ours = combine(peftc_binary, dirs, weights, "svd", tmp_path / "rank8", "--svd-rank", "8")
    linear = peft_combination(dirs, weights, "linear", LLAMA, monkeypatch, same_signs=False)
    for name, layer in layers(ours, "default").items():
        norm = torch.linalg.norm(exact[name])
        a, b = factors(layer, "default")
        worst_svd = max(worst_svd, float(torch.linalg.norm(layer.scaling["default"] * product(a, b) - exact[name]) / norm))
        ref = layers(linear, "combined")[name]
        ra, rb = factors(ref, "combined")
        worst_linear = max(worst_linear,
                           float(torch.linalg.norm(ref.scaling["combined"] * product(ra, rb) - exact[name]) / norm))
    print(f"relative error against the true weighted delta: svd rank 8 {worst_svd:.2e}, "
          f"PEFT linear {worst_linear:.2e}")
    assert worst_svd < 1e-5
    assert worst_linear > 0.1  # the cross terms B_i A_j

    truncated = combine(peftc_binary, dirs, weights, "svd", tmp_path / "rank2", "--svd-rank", "2")
    for name, layer in layers(truncated, "default").items():
        a, b = factors(layer, "default")
        error = torch.linalg.norm(product(a, b) - exact[name])
        singular = torch.linalg.svdvals(exact[name])
        optimal = torch.sqrt((singular[2:] ** 2).sum())
        assert abs(error - optimal) <= 1e-4 * torch.linalg.norm(exact[name]), name


def test_svd_embedding_and_conv_layers(peftc_binary, tmp_path, monkeypatch):
    """Embeddings (deltas [num_embeddings, dim]) and Conv2d (deltas flattened), ranks 4 and 2."""
    def make(base, out, seed, **lora):
        model = peft.get_peft_model(load_base(base), LoraConfig(**lora))
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "lora_" in name:
                    p.copy_(0.1 * torch.randn(p.shape, generator=gen))
        model.save_pretrained(out, save_embedding_layers=False)
        return out

    first = make(LLAMA, tmp_path / "e1", 1, r=4, lora_alpha=8, target_modules=["embed_tokens", "q_proj"],
                 task_type="CAUSAL_LM")
    second = make(LLAMA, tmp_path / "e2", 2, r=2, lora_alpha=4, target_modules=["embed_tokens"], task_type="CAUSAL_LM")
    ours = combine(peftc_binary, [first, second], [0.8, -0.6], "svd", tmp_path / "emb")
    compare(ours, peft_combination([first, second], [0.8, -0.6], "svd", LLAMA, monkeypatch))

    vit = FIXTURES / "models" / "vit"
    c1 = make(vit, tmp_path / "c1", 3, r=4, lora_alpha=8, target_modules=["projection"])
    c2 = make(vit, tmp_path / "c2", 4, r=2, lora_alpha=16, target_modules=["projection"])
    args = ["adapter", "combine", "--method", "svd", "--out", tmp_path / "conv", "--adapter", f"{c1}:1.5",
            "--adapter", f"{c2}:0.5"]
    run(peftc_binary, *args)
    ours = PeftModel.from_pretrained(load_base(vit), tmp_path / "conv").eval()
    compare(ours, peft_combination([c1, c2], [1.5, 0.5], "svd", vit, monkeypatch))


def test_a_rank_above_a_layer_is_padded_where_peft_fails(peftc_binary, tmp_path, monkeypatch):
    """k_proj of the tiny llama is 8 x 16: rank 12 keeps its full-rank delta, zero-padded; PEFT's is broken."""
    dirs = [ADAPTERS / "llama_lora", ADAPTERS / "llama_lora_second"]
    weights = [0.7, -1.3]
    exact = deltas_of_inputs(dirs, weights, LLAMA)
    ours = combine(peftc_binary, dirs, weights, "svd", tmp_path / "r12", "--svd-rank", "12")
    for name, layer in layers(ours, "default").items():
        a, b = factors(layer, "default")
        assert a.shape[0] == 12 and b.shape[1] == 12
        error = torch.linalg.norm(layer.scaling["default"] * product(a, b) - exact[name])
        assert error <= 1e-5 * torch.linalg.norm(exact[name]), name
        if "k_proj" in name or "v_proj" in name:
            assert torch.count_nonzero(a[8:]) == 0 and torch.count_nonzero(b[:, 8:]) == 0
    # PEFT gives such a module a lora_B of 8 columns beside a lora_A of 12 rows, and its forward fails.
    reference = peft_combination(dirs, weights, "svd", LLAMA, monkeypatch, same_signs=False, svd_rank=12)
    a, b = factors(layers(reference, "combined")["model.layers.0.self_attn.k_proj"], "combined")
    assert tuple(a.shape) == (12, 16) and tuple(b.shape) == (8, 8)
    with pytest.raises(RuntimeError):
        reference(input_ids=torch.tensor([[1, 2, 3]]))


def test_svd_types_refuse_bad_settings(peftc_binary, tmp_path):
    dirs = [ADAPTERS / "llama_lora", ADAPTERS / "llama_lora_second"]
    args = ["adapter", "combine", "--out", tmp_path / "x"]
    for d in dirs:
        args += ["--adapter", f"{d}:1.0"]
    result = run(peftc_binary, *args, "--method", "dare_linear_svd", ok=False)
    assert result.returncode == 1 and "INVALID_ARGUMENT" in result.stderr and "density" in result.stderr
    result = run(peftc_binary, *args, "--method", "svd", "--svd-clamp", "-0.1", ok=False)
    assert result.returncode == 2 and "svd-clamp" in result.stderr
    result = run(peftc_binary, "adapter", "combine", "--out", tmp_path / "x", "--method", "svd",
                 "--adapter", f"{ADAPTERS / 'llama_dora'}:1", "--adapter", f"{dirs[0]}:1", ok=False)
    assert result.returncode == 1 and "UNSUPPORTED" in result.stderr and "DoRA" in result.stderr
    assert not (tmp_path / "x").exists()
