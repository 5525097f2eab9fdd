"""`peftc adapter combine --deltas`: the weighted sum of the modules' true deltas, judged by PEFT.

* Exact (LoRA inputs, "linear"): the combined adapter's delta, as PEFT computes it after loading it, equals
  sum_i w_i dW_i with dW_i PEFT's own get_delta_weight of each input (rsLoRA, rank and alpha patterns), and the
  model's logits equal those of the base with every input merged at its weight. PEFT's add_weighted_adapter
  "linear" of the same inputs is far from that sum (its cross terms): both numbers are asserted.
* Mixed methods (LoRA, LoHa, IA3 against its base), truncated to a rank or an energy: the error of each module
  against the true sum is the optimal truncation error (Eckart-Young, from torch's singular values in f64), and
  the error the report gives is the one measured.
* TIES and DARE on the deltas equal PEFT's own merge_utils.ties / dare_linear applied to the deltas (DARE given
  peft_c's masks, factor 2 of the formula in include/peft_c.h), at full rank.
* Refusals name the adapter and the reason; nothing is written.
* The direct merge (`peftc merge --combine ties|dare_*|magnitude_prune`): every weight is the base plus
  merge_utils of the adapters' own deltas (LoRA, rsLoRA, LoHa and IA3 together), DARE given the same masks;
  `--combine linear` is the plain merge, byte for byte.

Environment: PEFTC (the peftc binary), PEFT_TEST_DATA (see conftest.py).
"""
from __future__ import annotations

import json
import math
import os
import pathlib
import subprocess
import sys
import warnings

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")
from peft import PeftModel  # noqa: E402
from peft.tuners.lora import LoraLayer  # noqa: E402
from peft.utils import merge_utils  # noqa: E402

from merge_support import dare_keep  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[2]
FIXTURES = pathlib.Path(os.environ.get("PEFT_TEST_DATA") or REPO / "tests" / "fixtures")
ADAPTERS = FIXTURES / "adapters"
LLAMA = FIXTURES / "models" / "llama"
IDS = torch.tensor([[1, 5, 7, 9, 11, 3, 2, 4]])


def run(peftc, *args, ok=True):
    result = subprocess.run([str(peftc), *map(str, args)], capture_output=True, text=True)
    if ok:
        assert result.returncode == 0, result.stderr
    return result


def load_base(base=LLAMA):
    return transformers.AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32).eval()


def method_adapter(case, tmp_path):
    sys.path.insert(0, str(FIXTURES))
    from generator.method_adapters import make_method_adapter

    return make_method_adapter(case, LLAMA, tmp_path / case)


def true_deltas(adapter) -> dict[str, torch.Tensor]:
    """PEFT's change of every weight the adapter touches: merged minus base, in f64 ([out, in])."""
    base = load_base()
    before = {n: p.detach().double().clone() for n, p in base.named_parameters()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        merged = PeftModel.from_pretrained(base, adapter).merge_and_unload()
    deltas = {}
    for n, p in merged.named_parameters():
        d = p.detach().double() - before[n]
        if n.endswith(".weight") and torch.count_nonzero(d):
            deltas[n.removesuffix(".weight")] = d
    return deltas


def lora_deltas(adapter) -> dict[str, torch.Tensor]:
    """get_delta_weight of each LoRA layer, in f64."""
    model = PeftModel.from_pretrained(load_base(), adapter)
    return {n.removeprefix("base_model.model."): m.get_delta_weight("default").detach().double()
            for n, m in model.named_modules() if isinstance(m, LoraLayer) and "default" in m.lora_A}


def weighted_sum(parts, weights):
    total = {}
    for deltas, w in zip(parts, weights):
        for name, d in deltas.items():
            total[name] = total.get(name, 0) + w * d
    return total


def combine(peftc, adapters, weights, out, *options, method="linear"):
    args = ["adapter", "combine", "--deltas", "--method", method, "--out", out, "--json", *options]
    for a, w in zip(adapters, weights):
        args += ["--adapter", f"{a}:{w!r}"]
    report = json.loads(run(peftc, *args).stdout)
    return report


def combined_deltas(out) -> dict[str, torch.Tensor]:
    return lora_deltas(out)


def test_exact_combination_is_the_weighted_sum_of_the_deltas(peftc_binary, tmp_path, monkeypatch):
    names = ["llama_lora", "llama_rslora", "llama_rank_alpha_pattern"]
    weights = [0.7, -1.3, 0.5]
    adapters = [ADAPTERS / n for n in names]
    expected = weighted_sum([lora_deltas(a) for a in adapters], weights)
    report = combine(peftc_binary, adapters, weights, tmp_path / "exact")
    assert all(m["relative_error"] == 0 for m in report["modules"])
    got = combined_deltas(tmp_path / "exact")
    assert set(got) == set(expected)
    worst = max(float(torch.linalg.norm(got[n] - expected[n]) / torch.linalg.norm(expected[n])) for n in got)
    assert worst < 1e-6, worst
    # The rank of each module is the sum of the inputs' ranks there (rank_pattern included).
    config = json.loads((tmp_path / "exact" / "adapter_config.json").read_text())
    q0 = "model.layers.0.self_attn.q_proj"
    assert config["rank_pattern"].get(q0, config["r"]) == 4 + 4 + 8
    # The model: base + every input merged at its weight.
    reference = load_base()
    with torch.no_grad():
        for name, p in reference.named_parameters():
            key = name.removesuffix(".weight")
            if name.endswith(".weight") and key in expected:
                p += expected[key].float()
        ours = PeftModel.from_pretrained(load_base(), tmp_path / "exact").eval()
        assert torch.allclose(ours(input_ids=IDS).logits, reference(input_ids=IDS).logits, rtol=1e-4, atol=1e-5)

    # PEFT's add_weighted_adapter("linear") of the two equal-rank inputs, against the same true sum.
    pair, pair_weights = [ADAPTERS / "llama_lora", ADAPTERS / "llama_lora_second"], [0.7, -1.3]
    truth = weighted_sum([lora_deltas(a) for a in pair], pair_weights)
    combine(peftc_binary, pair, pair_weights, tmp_path / "pair")
    ours_pair = combined_deltas(tmp_path / "pair")
    model = PeftModel.from_pretrained(load_base(), pair[0], adapter_name="a0")
    model.load_adapter(pair[1], adapter_name="a1")
    model.add_weighted_adapter(["a0", "a1"], pair_weights, "linear", combination_type="linear")
    linear = {n.removeprefix("base_model.model."): m.get_delta_weight("linear").detach().double()
              for n, m in model.named_modules() if isinstance(m, LoraLayer) and "linear" in m.lora_A}
    ours_error = max(float(torch.linalg.norm(ours_pair[n] - truth[n]) / torch.linalg.norm(truth[n])) for n in truth)
    peft_error = max(float(torch.linalg.norm(linear[n] - truth[n]) / torch.linalg.norm(truth[n])) for n in truth)
    print(f"relative error against the weighted delta: peft_c --deltas {ours_error:.2e}, PEFT linear {peft_error:.2e}")
    assert ours_error < 1e-6 and peft_error > 0.1


@pytest.mark.parametrize("choice", [["--rank", "4"], ["--energy", "0.9"]], ids=["rank4", "energy0.9"])
def test_mixed_methods_truncated_with_the_optimal_error(choice, peftc_binary, tmp_path):
    loha = method_adapter("llama_loha", tmp_path)
    ia3 = method_adapter("llama_ia3", tmp_path)
    adapters = [ADAPTERS / "llama_lora", loha, ia3]
    weights = [1.0, 0.5, 0.8]
    expected = weighted_sum([true_deltas(a) for a in adapters], weights)
    report = combine(peftc_binary, adapters, weights, tmp_path / "mixed", "--base", LLAMA, *choice)
    reported = {m["name"]: m for m in report["modules"]}
    got = combined_deltas(tmp_path / "mixed")
    assert set(got) == set(expected) == set(reported)
    for name, truth in expected.items():
        norm = torch.linalg.norm(truth)
        rank = reported[name]["rank"]
        singular = torch.linalg.svdvals(truth)
        optimal = float(torch.sqrt((singular[rank:] ** 2).sum()) / norm)
        measured = float(torch.linalg.norm(got[name] - truth) / norm)
        # f32 deltas (and, for IA3, PEFT's f32 merge W * l - W) against f64: a few 1e-6 of the norm.
        assert abs(measured - optimal) <= 2e-5, (name, measured, optimal)
        assert abs(reported[name]["relative_error"] - measured) <= 2e-5, (name, reported[name], measured)
        if choice[0] == "--energy":
            kept = float((singular[:rank] ** 2).sum() / (singular ** 2).sum())
            assert kept >= 0.9 - 1e-5, (name, kept)


def merged_changes(adapter, base_dir) -> dict[str, torch.Tensor]:
    """Every parameter PEFT's merge_and_unload changes (weights and biases), merged minus base, f64."""
    base = transformers.AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32).eval()
    before = {n: p.detach().double().clone() for n, p in base.named_parameters()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        merged = PeftModel.from_pretrained(base, adapter).merge_and_unload()
    changes = {}
    for n, p in merged.named_parameters():
        d = p.detach().double() - before.get(n, torch.zeros_like(p.detach().double()))
        if torch.count_nonzero(d):
            changes[n] = d
    return changes


def test_lora_bias_is_carried(peftc_binary, tmp_path):
    """Inputs with lora_bias: PEFT's forward of the combined adapter equals the base with the weighted sum of
    what each input's merge_and_unload changes (weights and biases). PEFT's own merge_and_unload of the
    combination refuses it: lora_bias holds for every module, and o_proj has no base bias to merge into."""
    qwen2 = FIXTURES / "models" / "qwen2"
    adapters = [ADAPTERS / "qwen2_lora_bias", ADAPTERS / "qwen2_lora"]
    weights = [0.8, -0.5]
    expected = weighted_sum([merged_changes(a, qwen2) for a in adapters], weights)
    assert any(n.endswith(".bias") for n in expected)
    combine(peftc_binary, adapters, weights, tmp_path / "bias")
    config = json.loads((tmp_path / "bias" / "adapter_config.json").read_text())
    assert config["lora_bias"] is True
    reference = transformers.AutoModelForCausalLM.from_pretrained(qwen2, dtype=torch.float32).eval()
    with torch.no_grad():
        for name, p in reference.named_parameters():
            if name in expected:
                p += expected[name].float()
        ours = PeftModel.from_pretrained(
            transformers.AutoModelForCausalLM.from_pretrained(qwen2, dtype=torch.float32), tmp_path / "bias").eval()
        got, want = ours(input_ids=IDS).logits, reference(input_ids=IDS).logits
    assert torch.allclose(got, want, rtol=1e-4, atol=1e-5), float((got - want).abs().max())
    with pytest.raises(RuntimeError, match="no bias"):
        ours.merge_and_unload()


def dare_mask(seed: int, module: str, adapter: int, shape, density: float) -> torch.Tensor:
    """peft_c's DARE mask of a delta (factor 2)."""
    keep = dare_keep(seed, module, adapter, 2, math.prod(shape), density)
    return torch.tensor(keep, dtype=torch.float32).reshape(shape)


def merge_utils_of(method, tensors, w, density, sign, seed, name, monkeypatch) -> torch.Tensor:
    """PEFT's merge_utils.METHOD of the tensors; DARE given peft_c's masks of module `name`."""
    if method.startswith("dare"):
        masks = [dare_mask(seed, name, i, tuple(t.shape), density) for i, t in enumerate(tensors)]
        monkeypatch.setattr(torch, "bernoulli", lambda p, *a, **k: masks.pop(0))
    if method == "ties":
        expected = merge_utils.ties(tensors, w, density, sign)
    elif method == "magnitude_prune":
        expected = merge_utils.magnitude_prune(tensors, w, density)
    elif method == "dare_linear":
        expected = merge_utils.dare_linear(tensors, w, density)
    else:
        expected = merge_utils.dare_ties(tensors, w, density, sign)
    monkeypatch.undo()
    return expected


@pytest.mark.parametrize("method,density,sign", [("ties", 0.5, "total"), ("ties", 0.3, "frequency"),
                                                  ("magnitude_prune", 0.6, "total"), ("dare_linear", 0.5, "total"),
                                                  ("dare_ties", 0.4, "frequency")])
def test_pruning_on_the_deltas_is_peft_merge_utils(method, density, sign, peftc_binary, tmp_path, monkeypatch):
    seed = 31337
    adapters = [ADAPTERS / "llama_lora", ADAPTERS / "llama_rslora"]
    weights = [0.9, -0.6]
    inputs = [lora_deltas(a) for a in adapters]
    # Energy 1: every singular value kept, so the pruned sums are written whole.
    report = combine(peftc_binary, adapters, weights, tmp_path / "pruned", "--density", repr(density),
                     "--majority-sign", sign, "--seed", str(seed), "--energy", "1", method=method)
    got = combined_deltas(tmp_path / "pruned")
    assert {m["name"] for m in report["modules"]} == set(got)
    for name in got:
        # The inputs that have the module, in order (DARE's adapter index counts those only).
        present = [i for i, d in enumerate(inputs) if name in d]
        tensors = [inputs[i][name].float() for i in present]
        w = torch.tensor([weights[i] for i in present])
        expected = merge_utils_of(method, tensors, w, density, sign, seed, name, monkeypatch)
        expected = expected.double()
        error = torch.linalg.norm(got[name] - expected) / torch.linalg.norm(expected)
        assert error < 1e-5, (name, float(error))


def test_refusals_name_the_reason(peftc_binary, tmp_path, monkeypatch):
    out = tmp_path / "bad"
    lora = ADAPTERS / "llama_lora"
    cases = [
        ([ADAPTERS / "llama_dora", lora], ["--method", "linear"], "UNSUPPORTED", "DoRA"),
        ([lora, ADAPTERS / "llama_lora_second"], ["--method", "ties", "--density", "0.5"], "INVALID_ARGUMENT",
         "rank or an energy"),
        ([lora, method_adapter("llama_loha", tmp_path)], ["--method", "linear"], "INVALID_ARGUMENT", "LOHA"),
        ([lora], ["--method", "svd"], "INVALID_ARGUMENT", "linear, ties"),
        ([lora, ADAPTERS / "llama_lora_second"], ["--method", "dare_ties"], "INVALID_ARGUMENT", "density"),
    ]
    for adapters, options, code, text in cases:
        args = ["adapter", "combine", "--deltas", "--out", out, *options]
        for a in adapters:
            args += ["--adapter", f"{a}:1"]
        result = run(peftc_binary, *args, ok=False)
        assert result.returncode == 1 and code in result.stderr and text in result.stderr, (adapters, result.stderr)
        assert not out.exists()
    result = run(peftc_binary, "adapter", "combine", "--out", out, "--method", "linear", "--rank", "4",
                 "--adapter", f"{lora}:1", ok=False)
    assert result.returncode == 2 and "--deltas" in result.stderr


def merged_weights(out) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file
    return load_file(str(out / "model.safetensors"))


@pytest.mark.parametrize("method,density,sign", [("ties", 0.5, "total"), ("magnitude_prune", 0.6, "total"),
                                                  ("dare_linear", 0.5, "total"), ("dare_ties", 0.4, "frequency")])
@pytest.mark.parametrize("inputs", ["lora", "mixed"])
def test_direct_merge_with_pruning_is_merge_utils_on_the_deltas(inputs, method, density, sign, peftc_binary, tmp_path,
                                                                 monkeypatch):
    """`peftc merge --combine METHOD`: every weight is W + merge_utils.METHOD of the adapters' own deltas (PEFT's
    merge_and_unload minus the base, for LoRA, rsLoRA, LoHa and IA3 alike), rounded once to f32; DARE given
    peft_c's masks; every other tensor is the base's, bit for bit. LoRA inputs only take the sliced path (the
    deltas built a slice of rows at a time), mixed ones the whole-delta path."""
    seed = 4242
    adapters = [ADAPTERS / "llama_lora", ADAPTERS / "llama_rslora"]
    weights = [0.9, -0.6]
    if inputs == "mixed":
        adapters += [method_adapter("llama_loha", tmp_path), method_adapter("llama_ia3", tmp_path)]
        weights += [0.7, 1.0]
    inputs = [true_deltas(a) for a in adapters]
    out = tmp_path / "merged"
    args = ["merge", "--base", LLAMA, "--out", out, "--combine", method, "--density", repr(density),
            "--majority-sign", sign, "--seed", str(seed)]
    for a, w in zip(adapters, weights):
        args += ["--adapter", f"{a}:{w!r}"]
    run(peftc_binary, *args)
    merged = merged_weights(out)
    base = merged_weights(LLAMA)
    names = set().union(*inputs)
    for key, value in merged.items():
        if key.removesuffix(".weight") not in names:
            assert torch.equal(value, base[key]), key
    for name in sorted(names):
        present = [i for i, d in enumerate(inputs) if name in d]
        tensors = [inputs[i][name].float() for i in present]
        w = torch.tensor([weights[i] for i in present])
        expected = merge_utils_of(method, tensors, w, density, sign, seed, name, monkeypatch)
        got = merged[name + ".weight"].double() - base[name + ".weight"].double()
        error = torch.linalg.norm(got - expected.double()) / torch.linalg.norm(expected.double())
        assert error < 1e-5, (name, float(error))


def test_direct_merge_linear_is_the_plain_merge_and_refusals_name_the_reason(peftc_binary, tmp_path):
    lora, second = ADAPTERS / "llama_lora", ADAPTERS / "llama_lora_second"
    plain, linear = tmp_path / "plain", tmp_path / "linear"
    run(peftc_binary, "merge", "--base", LLAMA, "--out", plain, "--adapter", f"{lora}:0.5", "--adapter", f"{second}:1")
    run(peftc_binary, "merge", "--base", LLAMA, "--out", linear, "--adapter", f"{lora}:0.5", "--adapter", f"{second}:1",
        "--combine", "linear")
    assert (plain / "model.safetensors").read_bytes() == (linear / "model.safetensors").read_bytes()
    out = tmp_path / "bad"
    cases = [
        (["--adapter", f"{ADAPTERS / 'llama_dora'}:1", "--adapter", f"{lora}:1", "--combine", "ties", "--density", "0.5"],
         "UNSUPPORTED", "DoRA"),
        (["--adapter", f"{lora}:1", "--combine", "ties"], "INVALID_ARGUMENT", "density"),
        (["--adapter", f"{lora}:1", "--combine", "ties", "--density", "0.5", "--arithmetic", "ggml"],
         "INVALID_ARGUMENT", "ggml"),
    ]
    for options, code, text in cases:
        result = run(peftc_binary, "merge", "--base", LLAMA, "--out", out, *options, ok=False)
        assert result.returncode == 1 and code in result.stderr and text in result.stderr, (options, result.stderr)
        assert not out.exists()
    result = run(peftc_binary, "merge", "--base", LLAMA, "--out", out, "--adapter", f"{lora}:1", "--combine", "svd",
                 ok=False)
    assert result.returncode == 2 and "--combine must be" in result.stderr
