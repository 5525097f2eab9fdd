"""merge_checkpoint and merge_into / MergeRecord.remove, judged by PEFT's merge_and_unload.

Agreement required (the library's stated contract): F32 within 1e-6 relative to the largest value of
the tensor, BF16/F16 at most one unit in the last place; the merged folder loads in transformers and
gives the logits of PEFT's merged model.
"""

from __future__ import annotations

import json
import re
import shutil
import threading

import numpy as np
import pytest

import peft_c
from peft_c_test_support import FIXTURES, HEADER

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")
ml_dtypes = pytest.importorskip("ml_dtypes")
from safetensors import safe_open  # noqa: E402

ADAPTERS = FIXTURES / "adapters"
MANIFEST = ADAPTERS / "MANIFEST.json"
if not MANIFEST.exists():
    pytest.skip(f"{MANIFEST} not generated", allow_module_level=True)
ENTRIES = json.loads(MANIFEST.read_text())


def base_of(name):
    return FIXTURES / ENTRIES[name]["base"]


def model_class(base_dir):
    architecture = json.loads((base_dir / "config.json").read_text())["architectures"][0]
    return getattr(transformers, architecture)


_merged_cache: dict = {}


def peft_merged(names, weights=None):
    """PEFT's merge_and_unload of the adapters (weight 1 each) on their base: (model, state dict),
    or the exception PEFT raised."""
    key = tuple(names)
    if key not in _merged_cache:
        base_dir = base_of(names[0])
        try:
            model = model_class(base_dir).from_pretrained(base_dir)
            model = peft.PeftModel.from_pretrained(model, ADAPTERS / names[0], adapter_name="a0")
            for i, name in enumerate(names[1:], 1):
                model.load_adapter(ADAPTERS / name, adapter_name=f"a{i}")
            merged = model.merge_and_unload(adapter_names=[f"a{i}" for i in range(len(names))])
            merged.eval()
            _merged_cache[key] = (merged, {k: v.detach() for k, v in merged.state_dict().items()})
        except Exception as exc:  # PEFT cannot load it on the installed transformers
            _merged_cache[key] = exc
    return _merged_cache[key]


def ulps(a: np.ndarray, b: np.ndarray) -> int:
    """Largest distance in units in the last place between two 16-bit float arrays."""
    def ordered(x):
        bits = x.view(np.uint16).astype(np.int32)
        return np.where(bits & 0x8000, 0x8000 - bits, bits)  # monotone, +0 and -0 coincide
    return int(np.max(np.abs(ordered(a) - ordered(b)))) if a.size else 0


def assert_close(ours: np.ndarray, theirs, what: str):
    reference = theirs.contiguous()
    if reference.dtype in (torch.bfloat16, torch.float16):
        raw = reference.view(torch.int16).numpy().view(np.uint16)
        assert ours.dtype.itemsize == 2, what
        assert ulps(ours.view(np.uint16).reshape(raw.shape), raw) <= 1, what
    else:
        expected = reference.to(torch.float64).numpy()
        got = ours.astype(np.float64).reshape(expected.shape)
        scale = max(float(np.max(np.abs(expected))), 1e-30) if expected.size else 1.0
        assert np.max(np.abs(got - expected), initial=0.0) <= 1e-6 * scale, what


def read_folder(folder):
    """Every tensor of a model folder, in peft_c's raw form (bits preserved)."""
    with peft_c.Checkpoint.open(folder) as ckpt:
        return {name: ckpt.read(name, None) for name in ckpt}, {n: ckpt.tensor(n).dtype for n in ckpt}


def merge_targets():
    names = []
    for name in sorted(ENTRIES):
        config = json.loads((ADAPTERS / name / "adapter_config.json").read_text())
        if config.get("target_parameters"):
            continue
        names.append(name)
    return names


def test_merge_constants_mirror_the_header():
    text = HEADER.read_text()
    counts = dict(re.findall(r"^#define\s+PEFT_MERGE_TENSORS_([A-Z]+)\s+(\d+)", text, re.M))
    assert {k: int(v) for k, v in counts.items()} == {n: v for v, n in peft_c.merge.MERGE_TENSOR_COUNTS}
    keep = re.search(r"^#define\s+PEFT_MERGE_DTYPE_KEEP\s+\((-?\d+)\)", text, re.M)
    assert keep and int(keep.group(1)) == peft_c.merge.MERGE_DTYPE_KEEP


# ---- checkpoints ------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", merge_targets())
def test_merge_checkpoint_matches_peft(name, tmp_path):
    reference = peft_merged([name])
    if isinstance(reference, Exception):
        pytest.skip(f"PEFT cannot merge this adapter here: {type(reference).__name__}: {reference}")
    model, state = reference
    base_dir, out = base_of(name), tmp_path / "merged"
    result = peft_c.merge_checkpoint(base_dir, out, [ADAPTERS / name])

    tensors, dtypes = read_folder(out)
    assert result.merged + result.replaced + result.copied + result.added == len(tensors)
    assert result.bytes == sum(t.nbytes for t in tensors.values())
    assert all((out / f).exists() for f in result.files)
    base_files = sorted(p.name for p in base_dir.iterdir() if p.is_file())
    assert sorted(result.files) == sorted(set(base_files) | set(result.files))
    assert set(base_files) <= {p.name for p in out.iterdir()}  # tokenizer/config files copied too
    for tensor_name, value in tensors.items():
        if tensor_name in state:
            assert_close(value, state[tensor_name], f"{name}: {tensor_name}")

    # transformers loads the merged folder and gives PEFT's merged logits
    ours = model_class(out).from_pretrained(out)
    ours.eval()
    if model.main_input_name == "pixel_values":
        size = model.config.image_size
        kwargs = {"pixel_values": torch.randn(1, model.config.num_channels, size, size,
                                              generator=torch.Generator().manual_seed(0))}
    else:
        ids = torch.arange(1, 7).reshape(1, 6) % model.config.vocab_size
        kwargs = {"input_ids": ids}
        if getattr(model.config, "is_encoder_decoder", False):
            kwargs["decoder_input_ids"] = ids
    with torch.no_grad():
        expected, got = model(**kwargs), ours(**kwargs)
    key = "logits" if hasattr(expected, "logits") else "last_hidden_state"
    e, g = getattr(expected, key).float(), getattr(got, key).float()
    tol = 2e-2 if model.dtype in (torch.bfloat16, torch.float16) else 1e-4
    assert torch.allclose(e, g, rtol=tol, atol=tol * float(e.abs().max())), name


def test_two_adapters_like_peft_and_weights_like_the_formula(tmp_path):
    names = ["llama_lora", "llama_lora_second"]
    reference = peft_merged(names)
    if isinstance(reference, Exception):
        pytest.skip(f"PEFT cannot merge: {reference}")
    _, state = reference
    out = tmp_path / "both"
    peft_c.merge_checkpoint(base_of(names[0]), out, [ADAPTERS / n for n in names])
    tensors, _ = read_folder(out)
    for tensor_name, value in tensors.items():
        assert_close(value, state[tensor_name], tensor_name)

    # weights: W + sum_i w_i * scaling_i * B_i A_i, from the adapter's own tensors in float64
    weights = [0.5, -1.25]
    adapters = [peft_c.Adapter.open(ADAPTERS / n) for n in names]
    out2 = tmp_path / "weighted"
    peft_c.merge_checkpoint(base_of(names[0]), out2, list(zip(adapters, weights)))
    base, _ = read_folder(base_of(names[0]))
    weighted, _ = read_folder(out2)
    for module in adapters[0]:
        target = module.tensor("lora_A.weight").base_name
        expected = base[target].astype(np.float64)
        for adapter, w in zip(adapters, weights):
            m = adapter.module(module.name)
            delta = adapter.read(m, "lora_B.weight", "F64") @ adapter.read(m, "lora_A.weight", "F64")
            expected = expected + w * m.scaling * delta
        assert_close(weighted[target], torch.from_numpy(expected.astype(np.float32)), target)


def test_dtype_and_resharding(tmp_path):
    name = "llama_lora"
    plain, bf16, sharded = tmp_path / "plain", tmp_path / "bf16", tmp_path / "sharded"
    peft_c.merge_checkpoint(base_of(name), plain, [ADAPTERS / name])
    peft_c.merge_checkpoint(base_of(name), bf16, [ADAPTERS / name], dtype="BF16")
    result = peft_c.merge_checkpoint(base_of(name), sharded, [ADAPTERS / name], max_shard_size=5000)
    ours, _ = read_folder(plain)
    converted, dtypes = read_folder(bf16)
    assert set(dtypes.values()) == {"BF16"}
    for tensor_name, value in ours.items():
        # computed in f32 and rounded once: the bf16 file is the f32 merge rounded (torch rounds too)
        expected = torch.from_numpy(value.astype(np.float32)).to(torch.bfloat16)
        assert_close(converted[tensor_name], expected, tensor_name)
    config = json.loads((bf16 / "config.json").read_text())
    assert "bfloat16" in (config.get("dtype"), config.get("torch_dtype"))
    assert "model.safetensors.index.json" in result.files and len(result.files) > 3
    resharded, _ = read_folder(sharded)
    assert resharded.keys() == ours.keys()
    assert all(np.array_equal(resharded[k], ours[k]) for k in ours)


def test_results_do_not_depend_on_threads(tmp_path):
    name = "llama_dora"
    one, many = tmp_path / "one", tmp_path / "many"
    peft_c.merge_checkpoint(base_of(name), one, [ADAPTERS / name], threads=1)
    peft_c.merge_checkpoint(base_of(name), many, [ADAPTERS / name], threads=4)
    assert (one / "model.safetensors").read_bytes() == (many / "model.safetensors").read_bytes()


def test_progress_and_cancellation(tmp_path):
    name = "llama_lora"
    seen = []
    result = peft_c.merge_checkpoint(base_of(name), tmp_path / "p", [ADAPTERS / name],
                                     progress=lambda done, total: seen.append((done, total)))
    assert seen[0][0] == 0 and seen[-1] == (result.bytes, result.bytes)
    assert all(a[0] <= b[0] and a[1] == b[1] for a, b in zip(seen, seen[1:]))

    out = tmp_path / "cancelled"
    with pytest.raises(peft_c.CancelledError):
        peft_c.merge_checkpoint(base_of(name), out, [ADAPTERS / name],
                                progress=lambda done, total: done > 0)
    assert not out.exists()

    existing = tmp_path / "existing"
    existing.mkdir()
    (existing / "keep.txt").write_text("mine")

    def boom(done, total):
        if done:
            raise RuntimeError("host stops")

    with pytest.raises(RuntimeError, match="host stops") as info:
        peft_c.merge_checkpoint(base_of(name), existing, [ADAPTERS / name], progress=boom)
    assert isinstance(info.value.__cause__, peft_c.CancelledError)
    assert sorted(p.name for p in existing.iterdir()) == ["keep.txt"]


def test_merge_errors(tmp_path):
    name = "llama_lora"
    with pytest.raises(ValueError):
        peft_c.merge_checkpoint(base_of(name), tmp_path / "x", [])
    with pytest.raises(ValueError):
        peft_c.merge_checkpoint(base_of(name), tmp_path / "x", [(ADAPTERS / name, float("nan"))])
    with pytest.raises(peft_c.InvalidArgumentError):
        peft_c.merge_checkpoint(base_of(name), base_of(name), [ADAPTERS / name])
    with pytest.raises((peft_c.UnresolvedKeyError, peft_c.ShapeMismatchError)):
        peft_c.merge_checkpoint(FIXTURES / "models" / "gpt2", tmp_path / "y", [ADAPTERS / name])
    assert not (tmp_path / "y").exists()
    with pytest.raises(ValueError):
        peft_c.merge_checkpoint(base_of(name), tmp_path / "z", [ADAPTERS / name], dtype="I32")



def test_require_config(tmp_path):
    """A base folder without config.json is refused unless ``require_config`` is False."""
    base = tmp_path / "base"
    base.mkdir()
    shutil.copy(FIXTURES / "models" / "llama" / "model.safetensors", base)
    with pytest.raises(peft_c.NotFoundError, match="config.json"):
        peft_c.merge_checkpoint(base, tmp_path / "out", [ADAPTERS / "llama_lora"])
    assert not (tmp_path / "out").exists()
    result = peft_c.merge_checkpoint(base, tmp_path / "out", [ADAPTERS / "llama_lora"], require_config=False)
    assert "config.json" not in result.files
    assert (tmp_path / "out" / "model.safetensors").exists()
    assert not (tmp_path / "out" / "config.json").exists()


def test_allow_nonfinite(tmp_path):
    """lora_alpha 4e12 overflows F16: refused by default, written as computed with ``allow_nonfinite``."""
    adapter = tmp_path / "adapter"
    shutil.copytree(ADAPTERS / "llama_lora", adapter)
    config = json.loads((adapter / "adapter_config.json").read_text())
    config["lora_alpha"] = 4e12
    (adapter / "adapter_config.json").write_text(json.dumps(config))
    base = FIXTURES / "models" / "llama"
    with pytest.raises(peft_c.NonFiniteError):
        peft_c.merge_checkpoint(base, tmp_path / "out", [adapter], dtype="F16")
    assert not (tmp_path / "out").exists()
    peft_c.merge_checkpoint(base, tmp_path / "out", [adapter], dtype="F16", allow_nonfinite=True)
    with safe_open(str(tmp_path / "out" / "model.safetensors"), "np") as merged:
        assert any(np.isinf(merged.get_tensor(key).astype(np.float32)).any() for key in merged.keys())


def test_tied_embeddings(tmp_path):
    """``tied_embeddings``: a LoRA on the tied lm_head of the gemma fixture unties the pair by default
    (lm_head.weight added holding the original embedding plus the LoRA, a note) and lands in the
    shared tensor with "shared"; a bad name is refused."""
    from safetensors.numpy import save_file

    base = FIXTURES / "models" / "gemma"
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps(
        {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": 2, "lora_alpha": 2, "target_modules": ["lm_head"]}))
    rng = np.random.default_rng(0)
    la = rng.standard_normal((2, 16)).astype(np.float32)
    lb = rng.standard_normal((64, 2)).astype(np.float32)
    save_file({"base_model.model.lm_head.lora_A.weight": la, "base_model.model.lm_head.lora_B.weight": lb},
              str(adapter / "adapter_model.safetensors"))
    with safe_open(str(base / "model.safetensors"), "np") as b:
        embedding = b.get_tensor("model.embed_tokens.weight")

    result = peft_c.merge_checkpoint(base, tmp_path / "untie", [adapter])
    assert result.untied_embeddings and result.added == 1
    assert any('"lm_head.weight" was added' in note for note in result.notes)
    assert json.loads((tmp_path / "untie" / "config.json").read_text())["tie_word_embeddings"] is False
    with safe_open(str(tmp_path / "untie" / "model.safetensors"), "np") as merged:
        assert merged.get_tensor("model.embed_tokens.weight").tobytes() == embedding.tobytes()
        np.testing.assert_allclose(merged.get_tensor("lm_head.weight"), embedding + lb @ la, rtol=0, atol=1e-5)

    result = peft_c.merge_checkpoint(base, tmp_path / "shared", [adapter], tied_embeddings="shared")
    assert not result.untied_embeddings and result.added == 0 and result.merged == 1
    with safe_open(str(tmp_path / "shared" / "model.safetensors"), "np") as merged:
        assert "lm_head.weight" not in merged.keys()
        np.testing.assert_allclose(merged.get_tensor("model.embed_tokens.weight"), embedding + lb @ la, rtol=0,
                                   atol=1e-5)
    with pytest.raises(ValueError, match="tied_embeddings"):
        peft_c.merge_checkpoint(base, tmp_path / "bad", [adapter], tied_embeddings="both")


def test_arithmetic(tmp_path):
    """``arithmetic="ggml"``: each delta value is float products summed in double over the rank, times the
    float scale, added in float (llama-export-lora on ggml's scalar build); DoRA is refused; a bad name too."""
    base = FIXTURES / "models" / "llama"
    peft_c.merge_checkpoint(base, tmp_path / "ggml", [(ADAPTERS / "llama_lora", 0.5)], arithmetic="ggml")
    config = json.loads((ADAPTERS / "llama_lora" / "adapter_config.json").read_text())
    with safe_open(str(base / "model.safetensors"), "np") as b, \
            safe_open(str(ADAPTERS / "llama_lora" / "adapter_model.safetensors"), "np") as a, \
            safe_open(str(tmp_path / "ggml" / "model.safetensors"), "np") as merged:
        key = "model.layers.0.self_attn.q_proj.weight"
        stem = "base_model.model." + key[:-len(".weight")]
        la, lb = a.get_tensor(stem + ".lora_A.weight"), a.get_tensor(stem + ".lora_B.weight")
        total = sum((lb[:, k:k + 1] * la[k:k + 1, :]).astype(np.float64) for k in range(la.shape[0]))
        scale = np.float32(0.5) * np.float32(config["lora_alpha"]) / np.float32(la.shape[0])
        want = total.astype(np.float32) * scale + b.get_tensor(key)
        assert merged.get_tensor(key).tobytes() == want.tobytes()
    with pytest.raises(peft_c.UnsupportedError, match="DoRA"):
        peft_c.merge_checkpoint(base, tmp_path / "dora", [ADAPTERS / "llama_dora"], arithmetic="ggml")
    assert not (tmp_path / "dora").exists()
    with pytest.raises(ValueError, match="arithmetic"):
        peft_c.merge_checkpoint(base, tmp_path / "bad", [ADAPTERS / "llama_lora"], arithmetic="fast")


# ---- buffers -------------------------------------------------------------------------------------------

def lora_modules(adapter):
    return [m for m in adapter if m.kind.name in ("LINEAR", "CONV1D", "EMBEDDING")]


@pytest.mark.parametrize("name", ["llama_lora", "llama_rslora", "llama_dora", "gpt2_lora",
                                  "llama_bf16_lora", "llama_embedding", "llama_rank_alpha_pattern"])
def test_merge_into_equals_checkpoint_merge_and_peft(name, tmp_path):
    base_dir = base_of(name)
    merged_dir = tmp_path / "merged"
    peft_c.merge_checkpoint(base_dir, merged_dir, [ADAPTERS / name])
    merged, _ = read_folder(merged_dir)
    base, _ = read_folder(base_dir)
    reference = peft_merged([name])
    with peft_c.Adapter.open(ADAPTERS / name, base_dir=base_dir) as adapter:
        for module in lora_modules(adapter):
            target = module.tensors[0].base_name
            buffer = base[target].copy()
            record = peft_c.merge_into(adapter, module.name, buffer, keep_original_rows=True)
            assert record.active and record.module == module.name and record.saved_bytes > 0
            assert buffer.tobytes() == merged[target].tobytes(), target  # the same arithmetic
            if not isinstance(reference, Exception):
                assert_close(buffer, reference[1][target], target)
            record.remove(buffer)
            assert not record.active
            assert buffer.tobytes() == base[target].tobytes(), target  # bit for bit
            with pytest.raises(peft_c.InvalidArgumentError):
                record.remove(buffer)  # spent


def test_arithmetic_removal_is_close(tmp_path):
    with peft_c.Adapter.open(ADAPTERS / "llama_lora") as adapter:
        base, _ = read_folder(base_of("llama_lora"))
        module = lora_modules(adapter)[0]
        target = module.tensors[0].base_name
        buffer = base[target].copy()
        record = peft_c.merge_into(adapter, target, buffer, scale=0.5)  # by weight name
        assert record.saved_bytes == 0
        assert not np.array_equal(buffer, base[target])
        record.remove(buffer)
        assert np.allclose(buffer, base[target], rtol=1e-6, atol=1e-6)


def test_merge_into_torch_tensors_and_translated_names():
    with peft_c.Adapter.open(ADAPTERS / "llama_lora", base_dir=base_of("llama_lora")) as adapter:
        base, _ = read_folder(base_of("llama_lora"))
        translator = adapter.translator()
        module = adapter.module("model.layers.0.self_attn.q_proj")
        native = translator.to_native(module.tensors[0].key).rsplit("/", 1)[0]
        target = module.tensors[0].base_name
        as_numpy = base[target].copy()
        peft_c.merge_into(adapter, module.name, as_numpy)
        as_torch = torch.from_numpy(base[target].copy())
        peft_c.merge_into(adapter, native, as_torch, translator=translator)
        assert np.array_equal(as_torch.numpy(), as_numpy)
        # the same bf16 buffer as a torch tensor and as an ml_dtypes array: the same result
        bf16 = torch.from_numpy(base[target].copy()).to(torch.bfloat16)
        as_ml = bf16.view(torch.int16).numpy().copy().view(ml_dtypes.bfloat16)
        peft_c.merge_into(adapter, module.name, bf16)
        peft_c.merge_into(adapter, module.name, as_ml)
        assert bf16.view(torch.int16).numpy().tobytes() == as_ml.tobytes()
        raw = torch.from_numpy(base[target].copy()).to(torch.bfloat16).view(torch.int16).numpy().copy()
        peft_c.merge_into(adapter, module.name, raw.view(np.uint16), dtype="BF16")
        assert raw.tobytes() == as_ml.tobytes()


def test_merge_into_with_lora_bias():
    name = "qwen2_lora_bias"
    reference = peft_merged([name])
    with peft_c.Adapter.open(ADAPTERS / name, base_dir=base_of(name)) as adapter:
        base, _ = read_folder(base_of(name))
        module = next(m for m in lora_modules(adapter) if "lora_B.bias" in [t.role for t in m.tensors])
        weight_name = module.tensor("lora_A.weight").base_name
        bias_name = module.tensor("lora_B.bias").base_name
        weight, bias = base[weight_name].copy(), base[bias_name].copy()
        with pytest.raises(ValueError, match="bias"):
            peft_c.merge_into(adapter, module.name, weight)
        with pytest.raises(ValueError, match="elements"):
            peft_c.merge_into(adapter, module.name, weight, bias=np.zeros(bias.size + 1, bias.dtype))
        assert np.array_equal(weight, base[weight_name])  # nothing changed on failure
        record = peft_c.merge_into(adapter, module.name, weight, bias=bias, keep_original_rows=True)
        if not isinstance(reference, Exception):
            assert_close(weight, reference[1][weight_name], weight_name)
            assert_close(bias, reference[1][bias_name], bias_name)
        with pytest.raises(ValueError):
            record.remove(weight)  # the bias is needed too
        record.remove(weight, bias)
        assert np.array_equal(weight, base[weight_name]) and np.array_equal(bias, base[bias_name])


def test_merge_into_errors():
    with peft_c.Adapter.open(ADAPTERS / "llama_lora") as adapter:
        base, _ = read_folder(base_of("llama_lora"))
        module = lora_modules(adapter)[0]
        target = module.tensors[0].base_name
        good = base[target].copy()
        with pytest.raises(peft_c.NotFoundError):
            peft_c.merge_into(adapter, "model.layers.9.nothing", good)
        with pytest.raises(peft_c.ShapeMismatchError):
            peft_c.merge_into(adapter, module.name, np.zeros((3, 5), np.float32))
        with pytest.raises(ValueError):
            peft_c.merge_into(adapter, module.name, good.astype(np.float64))
        with pytest.raises(ValueError):
            peft_c.merge_into(adapter, module.name, np.zeros((good.shape[0], good.shape[1] * 2), np.float32)[:, ::2])
        read_only = good.copy()
        read_only.flags.writeable = False
        with pytest.raises(ValueError):
            peft_c.merge_into(adapter, module.name, read_only)
        with pytest.raises(ValueError):
            peft_c.merge_into(adapter, module.name, good.view(np.uint16))  # dtype unknown
        with pytest.raises(ValueError):
            peft_c.merge_into(adapter, module.name, good, scale=float("inf"))
        assert np.array_equal(good, base[target])
        record = peft_c.merge_into(adapter, module.name, good, keep_original_rows=True)
        with pytest.raises(ValueError):
            record.remove(good[:1].copy())  # another shape
        good[0] += 1  # rows changed since the merge: an exact removal refuses
        with pytest.raises(peft_c.InvalidArgumentError):
            record.remove(good)


def test_merge_into_from_many_threads():
    with peft_c.Adapter.open(ADAPTERS / "llama_lora") as adapter:
        base, _ = read_folder(base_of("llama_lora"))
        module = lora_modules(adapter)[0]
        target = module.tensors[0].base_name
        expected = base[target].copy()
        peft_c.merge_into(adapter, module.name, expected)
        buffers = [base[target].copy() for _ in range(8)]
        start = threading.Barrier(8)

        def work(i):
            start.wait()
            for _ in range(20):
                record = peft_c.merge_into(adapter, module.name, buffers[i], keep_original_rows=True)
                record.remove(buffers[i])
            peft_c.merge_into(adapter, module.name, buffers[i])

        threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert all(b.tobytes() == expected.tobytes() for b in buffers)


def _gguf(path, kvs, names, first):
    """A GGUF file of F32 2 x 2 tensors; kvs: (key, gguf type, value) with types 2 (u16), 5 (i32), 6, 8."""
    import struct

    def text(s):
        return struct.pack("<Q", len(s)) + s.encode()

    out = b"GGUF" + struct.pack("<IQQ", 3, len(names), len(kvs))
    for key, kind, value in kvs:
        out += text(key) + struct.pack("<I", kind)
        out += {2: lambda v: struct.pack("<H", v), 5: lambda v: struct.pack("<i", v),
                6: lambda v: struct.pack("<f", v), 8: text}[kind](value)
    for i, name in enumerate(names):
        out += text(name) + struct.pack("<IQQIQ", 2, 2, 2, 0, 32 * i)
    out += b"\0" * (-len(out) % 32)
    for i in range(len(names)):
        out += struct.pack("<4f", *(first + (4 * i + k) * 0.25 for k in range(4))) + b"\0" * 16
    path.write_bytes(out)


def test_join_split_merges_a_split_gguf_base_into_one_file(tmp_path):
    for no, name in enumerate(["blk.0.attn_v.weight", "blk.0.ffn_down.weight"]):
        kvs = [("general.architecture", 8, "llama")] if no == 0 else []
        kvs += [("split.no", 2, no), ("split.tensors.count", 5, 2), ("split.count", 2, 2)]
        _gguf(tmp_path / f"model-{no + 1:05d}-of-00002.gguf", kvs, [name], 1.0 - 2 * no)
    lora = tmp_path / "lora.gguf"
    _gguf(lora, [("general.architecture", 8, "llama"), ("general.type", 8, "adapter"), ("adapter.type", 8, "lora"),
                 ("adapter.lora.alpha", 6, 2.0)], ["blk.0.ffn_down.weight.lora_a", "blk.0.ffn_down.weight.lora_b"], 0.5)
    base = tmp_path / "model-00002-of-00002.gguf"
    parts = peft_c.merge_checkpoint(base, tmp_path / "out.gguf", [str(lora)])
    assert parts.files == ("out-00001-of-00002.gguf", "out-00002-of-00002.gguf")
    joined = peft_c.merge_checkpoint(base, tmp_path / "joined.gguf", [str(lora)], join_split=True)
    assert joined.files == ("joined.gguf",)


def _tuned_copy(tmp_path, name, seed):
    """The llama fixture with every tensor moved by seeded noise (a stand-in for a fine-tune)."""
    from safetensors.numpy import load_file, save_file

    base = FIXTURES / "models" / "llama"
    out = tmp_path / name
    out.mkdir()
    rng = np.random.default_rng(seed)
    tensors = {k: (v + 0.02 * rng.standard_normal(v.shape)).astype(v.dtype)
               for k, v in load_file(str(base / "model.safetensors")).items()}
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    shutil.copy(base / "config.json", out / "config.json")
    return out


def test_combine_models_writes_what_peftc_writes(tmp_path):
    import os
    import subprocess

    base = FIXTURES / "models" / "llama"
    models = [(_tuned_copy(tmp_path, "m0", 1), 0.7), (_tuned_copy(tmp_path, "m1", 2), -0.4)]
    result = peft_c.combine_models(base, models, tmp_path / "ours", method="dare_ties", density=0.5, seed=5,
                                   majority_sign_method="frequency")
    assert result.merged > 0 and result.copied == 0 and "model.safetensors" in result.files
    peftc = os.environ.get("PEFTC")
    if peftc:
        args = [peftc, "model", "combine", "--base", str(base), "--method", "dare_ties", "--density", "0.5",
                "--seed", "5", "--majority-sign", "frequency", "--out", str(tmp_path / "cli")]
        for m, w in models:
            args += ["--model", f"{m}:{w!r}"]
        subprocess.run(args, check=True, capture_output=True)
        assert (tmp_path / "ours" / "model.safetensors").read_bytes() == \
            (tmp_path / "cli" / "model.safetensors").read_bytes()
    # linear with weight 1 of one model gives that model back (its values, up to f32 rounding of W + (M - W)).
    peft_c.combine_models(base, [(models[0][0], 1.0)], tmp_path / "one", method="linear")
    with safe_open(str(tmp_path / "one" / "model.safetensors"), framework="np") as f, \
            safe_open(str(models[0][0] / "model.safetensors"), framework="np") as g:
        for key in f.keys():
            np.testing.assert_allclose(f.get_tensor(key), g.get_tensor(key), rtol=0, atol=1e-6)
    with pytest.raises(peft_c.InvalidArgumentError, match="density"):
        peft_c.combine_models(base, models, tmp_path / "bad", method="ties")
    with pytest.raises(ValueError):
        peft_c.combine_models(base, models, tmp_path / "bad", method="cat")
    assert not (tmp_path / "bad").exists()


def test_merge_combined_by_ties_writes_what_peftc_writes(tmp_path):
    import os
    import subprocess

    base = FIXTURES / "models" / "llama"
    lora, rslora = ADAPTERS / "llama_lora", ADAPTERS / "llama_rslora"
    adapters = [(str(lora), 0.9), (str(rslora), -0.6)]
    result = peft_c.merge_checkpoint(base, tmp_path / "ties", adapters, combine="ties", density=0.5)
    assert result.merged > 0 and "model.safetensors" in result.files
    ties = (tmp_path / "ties" / "model.safetensors").read_bytes()
    peftc = os.environ.get("PEFTC")
    if peftc:
        subprocess.run([peftc, "merge", "--base", str(base), "--out", str(tmp_path / "cli"),
                        "--adapter", f"{lora}:0.9", "--adapter", f"{rslora}:-0.6", "--combine", "ties",
                        "--density", "0.5"], check=True, capture_output=True)
        assert ties == (tmp_path / "cli" / "model.safetensors").read_bytes()
    # "linear" is the plain merge, which the ties merge is not.
    peft_c.merge_checkpoint(base, tmp_path / "plain", adapters)
    peft_c.merge_checkpoint(base, tmp_path / "linear", adapters, combine="linear")
    plain = (tmp_path / "plain" / "model.safetensors").read_bytes()
    assert (tmp_path / "linear" / "model.safetensors").read_bytes() == plain
    assert ties != plain
    # Refused when set, before anything is written.
    for kwargs in ({"combine": "ties"}, {"combine": "dare_ties", "seed": 3}, {"combine": "magnitude_prune"},
                   {"combine": "svd", "density": 0.5}, {"combine": "ties", "density": 1.5}):
        with pytest.raises(peft_c.InvalidArgumentError):
            peft_c.merge_checkpoint(base, tmp_path / "bad", adapters, **kwargs)
    with pytest.raises(ValueError):
        peft_c.merge_checkpoint(base, tmp_path / "bad", adapters, combine="sum")
    assert not (tmp_path / "bad").exists()
