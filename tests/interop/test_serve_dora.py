"""DoRA in unmerged apply (issue 18) against PEFT itself: ``lora_apply`` on a mixed batch whose rows use
DoRA adapters, a plain LoRA adapter or none gives, layer by layer, the outputs of PEFT's forward of
the unmerged model with each row's adapter active.

PEFT refuses ``adapter_names`` with DoRA, so its reference is one forward of the whole batch per
adapter (``set_adapter``) and one with adapters disabled; a row's expected input, base output and
output at a layer are those of the forward of its own adapter (rows do not mix in Linear or Conv1D
layers). peft_c then applies the three adapters to the mixed rows in ONE call per layer, from the
base weights given with ``Registry.set_base_weight`` (DoRA's weight norm, and the bias that the base
output includes: gpt2's Conv1D layers have one).

Adapters (made with PEFT in the test on the tiny fixture models llama, Linear, and gpt2, Conv1D with
fan_in_fan_out): two DoRA adapters (one with rslora, different target sets) and one plain LoRA (on
gpt2 with lora_bias). Factors and DoRA magnitudes are random, rounded to values bf16 holds, the
magnitudes scaled by random factors in [0.5, 1.5] so that magnitude / norm is far from 1.

* F32: max |ours - PEFT| <= 1e-5 x max |PEFT| in every layer.
* BF16 (PEFT's default autocast_adapter_dtype=True: adapters in f32, x cast to f32; PEFT subtracts
  the bias in bf16 and rounds the sum once): every element within 2 bf16 ulps of PEFT's, the ulp
  taken at the size of the largest of |base output|, |PEFT's output|, |base output - bias| (the
  value PEFT rounds to bf16 before scaling it by s - 1) and s x scaling x |x A^T| |B^T| (where
  cancellation in the rank sum shows, as in test_serve_apply.py).
* Rows of no adapter, and rows whose adapter lacks the layer, are left bit for bit as they were.

``test_base_weights_changed`` changes a layer's base weight in place: without
``base_weights_changed`` the kept scale no longer gives PEFT's output for the new weight; after it
the output is PEFT's again.
"""

from __future__ import annotations

import pathlib
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")
pytest.importorskip("ml_dtypes")

from serve_support import LORA_B_SCALE, TORCH_DTYPES, bf16_ulp_of, load_base, to_numpy  # noqa: E402

ADAPTERS = {
    "llama": {
        "dora_a": dict(r=4, lora_alpha=8, use_dora=True,
                       target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]),
        "lora": dict(r=8, lora_alpha=4, target_modules=["q_proj", "v_proj", "down_proj"]),
        "dora_b": dict(r=2, lora_alpha=16, use_rslora=True, use_dora=True,
                       target_modules=["q_proj", "v_proj", "up_proj", "down_proj"]),
    },
    "gpt2": {
        "dora_a": dict(r=4, lora_alpha=8, use_dora=True, target_modules=["c_attn", "c_proj", "c_fc"],
                       fan_in_fan_out=True),
        "lora": dict(r=8, lora_alpha=4, target_modules=["c_attn", "c_fc"], fan_in_fan_out=True, lora_bias=True),
        "dora_b": dict(r=2, lora_alpha=16, use_rslora=True, use_dora=True, target_modules=["c_proj", "c_fc"],
                       fan_in_fan_out=True),
    },
}
# Each sequence's adapter ("__base__": none).
BATCH = ["dora_a", "lora", "__base__", "dora_b", "dora_a", "lora"]
SEQUENCE_LENGTH = 8
BUDGET = 1 << 30


def base_dir(fixtures_dir: pathlib.Path, family: str) -> pathlib.Path:
    base = fixtures_dir / "models" / family
    if not (base / "model.safetensors").exists():
        pytest.skip(f"fixture {base} is absent (run tests/fixtures/generate.py)")
    return base


def make_adapters(base: pathlib.Path, family: str, out: pathlib.Path) -> dict[str, pathlib.Path]:
    from peft import LoraConfig, get_peft_model

    folders = {}
    for seed, (name, config) in enumerate(ADAPTERS[family].items()):
        torch.manual_seed(200 + seed)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = get_peft_model(load_base(base, torch.float32),
                                   LoraConfig(init_lora_weights=False, lora_dropout=0.0, **config))
        with torch.no_grad():
            for param_name, param in model.named_parameters():
                if "lora_B" in param_name:
                    param.mul_(LORA_B_SCALE)
                elif "lora_magnitude_vector" in param_name:
                    param.mul_(torch.empty_like(param).uniform_(0.5, 1.5))
                if "lora_" in param_name:
                    param.copy_(param.to(torch.bfloat16).to(torch.float32))
        folders[name] = out / name
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model.save_pretrained(str(folders[name]))
    return folders


@pytest.fixture(scope="module")
def dora_folders(tmp_path_factory, fixtures_dir):
    made: dict[str, dict[str, pathlib.Path]] = {}

    def folders(family: str) -> dict[str, pathlib.Path]:
        if family not in made:
            made[family] = make_adapters(base_dir(fixtures_dir, family), family,
                                         tmp_path_factory.mktemp(f"dora_{family}"))
        return made[family]

    return folders


def peft_model(base: pathlib.Path, dtype: torch.dtype, folders: dict[str, pathlib.Path]):
    from peft import PeftModel

    names = list(folders)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = PeftModel.from_pretrained(load_base(base, dtype), str(folders[names[0]]), adapter_name=names[0])
        for name in names[1:]:
            model.load_adapter(str(folders[name]), adapter_name=name)
    return model.eval()


def lora_layers(model) -> dict[str, object]:
    from peft.tuners.lora import LoraLayer

    return {name.removeprefix("base_model.model."): module for name, module in model.named_modules()
            if isinstance(module, LoraLayer)}


@torch.no_grad()
def capture(model, ids: torch.Tensor, adapter: str) -> dict[str, dict[str, torch.Tensor]]:
    """One forward of the whole batch with ``adapter`` active (or none for "__base__"): every LoRA
    layer's input, base output and output, flattened to rows x features."""
    captures: dict[str, dict] = {}
    hooks = []

    def flat(t):
        return t.detach().reshape(-1, t.shape[-1]).clone()

    for module_name, module in lora_layers(model).items():
        entry = captures.setdefault(module_name, {})

        def on_base(_m, _args, output, entry=entry):
            entry["base_out"] = flat(output)

        def on_layer(_m, args, output, entry=entry):
            entry["x"] = flat(args[0])
            entry["out"] = flat(output)

        hooks.append(module.base_layer.register_forward_hook(on_base))
        hooks.append(module.register_forward_hook(on_layer))
    try:
        if adapter == "__base__":
            with model.disable_adapter():
                model(input_ids=ids, attention_mask=torch.ones_like(ids))
        else:
            model.set_adapter(adapter)
            model(input_ids=ids, attention_mask=torch.ones_like(ids))
    finally:
        for hook in hooks:
            hook.remove()
    return captures


def give_base_weights(registry, model) -> None:
    for module_name, module in lora_layers(model).items():
        base = module.base_layer
        bias = base.bias.detach() if base.bias is not None else None
        registry.set_base_weight(module_name, base.weight.detach(), bias=bias)


def lora_terms(layer, x: np.ndarray, row_adapter: list[str]) -> np.ndarray:
    """Per element, s * scaling * |x A^T| |B^T| in float64 (s = 1 for plain LoRA): the size of what
    the rank sum adds up, where cancellation shows (as serve_support.Reference.terms)."""
    x64 = x.astype(np.float64)
    out = np.zeros((x.shape[0], layer.lora_B[next(iter(layer.lora_B))].weight.shape[0]))
    weight = layer.base_layer.weight.detach().double()
    if getattr(layer, "fan_in_fan_out", False):
        weight = weight.T
    for adapter in set(row_adapter):
        if adapter == "__base__" or adapter not in layer.lora_A:
            continue
        rows = np.array([a == adapter for a in row_adapter])
        a = layer.lora_A[adapter].weight.detach().double()
        b = layer.lora_B[adapter].weight.detach().double()
        scaling = layer.scaling[adapter]
        s = np.ones(b.shape[0])
        if adapter in layer.lora_magnitude_vector:
            norm = (weight + scaling * b @ a).norm(dim=1).numpy()
            s = np.abs(layer.lora_magnitude_vector[adapter].weight.detach().double().numpy()) / norm
        out[rows] = s * abs(scaling) * (np.abs(x64[rows] @ a.numpy().T) @ np.abs(b.numpy().T))
    return out


def raw(array: np.ndarray) -> np.ndarray:
    return array.view(np.uint16 if array.dtype.itemsize == 2 else np.uint32)


@pytest.mark.parametrize("dtype", ["F32", "BF16"])
@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_dora_apply_matches_peft_mixed_with_lora(family, dtype, peft_c, fixtures_dir, dora_folders):
    base = base_dir(fixtures_dir, family)
    folders = dora_folders(family)
    names = list(folders)
    model = peft_model(base, TORCH_DTYPES[dtype], folders)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (len(BATCH), SEQUENCE_LENGTH), generator=g)
    runs = {adapter: capture(model, ids, adapter) for adapter in set(BATCH)}
    sequence_of_row = np.repeat(np.arange(len(BATCH)), SEQUENCE_LENGTH)
    row_adapter = [BATCH[s] for s in sequence_of_row]
    row_lease = np.array([names.index(a) if a != "__base__" else -1 for a in row_adapter], dtype=np.int32)

    def mixed(module: str, what: str) -> np.ndarray:
        return np.stack([to_numpy(runs[a][module][what][i]) for i, a in enumerate(row_adapter)])

    layers = lora_layers(model)
    dora_layers = adapted_elements = 0
    worst = 0.0
    with peft_c.Registry(dtype, BUDGET) as registry:
        for name, folder in folders.items():
            registry.register(name, folder, base_dir=base)
        give_base_weights(registry, model)
        leases = [registry.acquire(name) for name in names]
        for module in sorted(layers):
            x, y, expected = mixed(module, "x"), mixed(module, "base_out"), mixed(module, "out")
            before = y.copy()
            peft_c.lora_apply(module, leases, row_lease, x, y)

            has = np.array([a != "__base__" and a in layers[module].lora_A for a in row_adapter])
            dora_layers += sum(a in layers[module].lora_magnitude_vector for a in names)
            adapted_elements += int(has.sum()) * y.shape[1]
            assert np.array_equal(raw(y[~has]), raw(before[~has])), module
            assert np.array_equal(raw(expected[~has]), raw(before[~has])), module
            ours, peft = y.astype(np.float64), expected.astype(np.float64)
            if dtype == "F32":
                rel = np.abs(ours - peft).max() / np.abs(peft).max()
                worst = max(worst, rel)
                assert rel <= 1e-5, f"{module}: differs from PEFT by {rel:.3g} of the output's scale"
            else:
                # PEFT rounds y - bias to bf16 before scaling it by s - 1: its size counts too.
                bias = layers[module].base_layer.bias
                centred = before.astype(np.float64) - (to_numpy(bias).astype(np.float64) if bias is not None else 0)
                size = np.maximum.reduce([np.abs(before.astype(np.float64)), np.abs(peft), np.abs(centred),
                                          lora_terms(layers[module], x, row_adapter)])
                scaled = np.abs(ours - peft) / bf16_ulp_of(size)
                worst = max(worst, float(scaled.max()))
                assert scaled.max() <= 2, (f"{module}: {int(np.sum(scaled > 2))} elements differ from PEFT's by "
                                           f"more than 2 ulps (at most {scaled.max():.3g})")
        for lease in leases:
            lease.release()
    assert dora_layers > 0 and adapted_elements > 0
    print(f"{family} {dtype}: {len(layers)} layers ({dora_layers} DoRA adapter layers), worst "
          f"{'relative difference' if dtype == 'F32' else 'scaled ulps'} {worst:.3g}")


def test_base_weights_changed(peft_c, fixtures_dir, dora_folders):
    """A DoRA scale is kept until base_weights_changed(), then computed from the buffers as they are."""
    base = base_dir(fixtures_dir, "gpt2")
    folders = dora_folders("gpt2")
    model = peft_model(base, torch.float32, folders)
    module = "transformer.h.0.mlp.c_fc"
    layer = lora_layers(model)[module]
    model.set_adapter("dora_a")
    g = torch.Generator().manual_seed(1)
    x = torch.randn(5, layer.base_layer.weight.shape[0], generator=g)

    with peft_c.Registry("F32", BUDGET) as registry:
        registry.register("dora_a", folders["dora_a"], base_dir=base)
        # The model's own tensors: changing them in place changes what the registry reads.
        registry.set_base_weight(module, layer.base_layer.weight.detach(), bias=layer.base_layer.bias.detach())
        lease = registry.acquire("dora_a")

        def ours_and_peft():
            with torch.no_grad():
                y = to_numpy(layer.base_layer(x))
                expected = to_numpy(layer(x)).astype(np.float64)
            peft_c.lora_apply(module, [lease], None, to_numpy(x), y)
            return y.astype(np.float64), expected

        def rel(a, b):
            return np.abs(a - b).max() / np.abs(b).max()

        ours, expected = ours_and_peft()
        assert rel(ours, expected) <= 1e-5
        with torch.no_grad():
            layer.base_layer.weight.mul_(1.5)
            layer.base_layer.bias.add_(0.25)
        stale, expected = ours_and_peft()
        assert rel(stale, expected) > 1e-3, "the scale should be the one computed before the change"
        registry.base_weights_changed()
        fresh, expected = ours_and_peft()
        assert rel(fresh, expected) <= 1e-5
        lease.release()


def test_dora_without_base_weight(peft_c, fixtures_dir, dora_folders):
    base = base_dir(fixtures_dir, "llama")
    folders = dora_folders("llama")
    module = "model.layers.0.self_attn.q_proj"
    with peft_c.Registry("F32", BUDGET) as registry:
        registry.register("dora_a", folders["dora_a"], base_dir=base)
        registry.register("lora", folders["lora"], base_dir=base)
        dora, lora = registry.acquire("dora_a"), registry.acquire("lora")
        x = np.ones((2, 16), dtype=np.float32)
        y = np.zeros((2, 16), dtype=np.float32)
        with pytest.raises(peft_c.NotFoundError, match="base weight"):
            peft_c.lora_apply(module, [lora, dora], np.array([0, 1], dtype=np.int32), x, y)
        assert not y.any()  # unchanged on failure
        peft_c.lora_apply(module, [lora], None, x, y)  # plain LoRA needs no base weight
        assert y.any()
        with pytest.raises(peft_c.ShapeMismatchError):
            registry.set_base_weight(module, np.ones((16, 8), dtype=np.float32))
            peft_c.lora_apply(module, [dora], None, x, y)
        dora.release()
        lora.release()
