//! Checkpoint merges (against W + weight * scaling * B @ A computed here in f64; weights, dtypes,
//! shards, threads), progress and cancellation, errors; buffer merges (the same bytes as the
//! checkpoint merge, exact restoration with kept rows, arithmetic removal, lora_B.bias, host
//! names, concurrency).

mod common;

use std::collections::HashMap;
use std::ops::ControlFlow;

use common::{expect_code, fixture, list_files, read_json, TempDir};
use peft_c::{
    merge_checkpoint, merge_checkpoint_with_progress, merge_into, Adapter, Buffer, Checkpoint, DType, ErrorCode,
    LayerKind, MergeBufferOptions, MergeOptions, Module, TiedEmbeddings, Writer,
};

/// weight * scaling * B @ A of a Linear module in f64, with each element's magnitude
/// |weight * scaling| * sum |B_ok A_ki| (which bounds the rounding error of an f32 computation).
fn lora_delta(module: Module<'_>, weight: f64) -> (Vec<f64>, Vec<f64>) {
    assert_eq!(module.kind(), LayerKind::Linear, "{module:?}");
    let a_t = module.tensor_by_role("lora_A.weight").unwrap();
    let b_t = module.tensor_by_role("lora_B.weight").unwrap();
    let (a, b) = (a_t.read_as::<f32>().unwrap(), b_t.read_as::<f32>().unwrap());
    let (r, inp, out) = (a_t.shape()[0] as usize, a_t.shape()[1] as usize, b_t.shape()[0] as usize);
    let s = weight * module.scaling();
    let mut delta = vec![0.0; out * inp];
    let mut magnitude = vec![0.0; out * inp];
    for o in 0..out {
        for i in 0..inp {
            let (mut sum, mut abs) = (0.0f64, 0.0f64);
            for k in 0..r {
                let p = f64::from(b[o * r + k]) * f64::from(a[k * inp + i]);
                sum += p;
                abs += p.abs();
            }
            delta[o * inp + i] = s * sum;
            magnitude[o * inp + i] = s.abs() * abs;
        }
    }
    (delta, magnitude)
}

/// A float32 computation whose terms have this magnitude errs by at most a few units of 2^-24 of it.
fn close_to(got: f32, want: f64, magnitude: f64) -> bool {
    (f64::from(got) - want).abs() <= 8.0 * f64::powi(2.0, -24) * magnitude
}

fn base_name(module: Module<'_>) -> String {
    module.tensor_by_role("lora_A.weight").unwrap().base_name().to_string()
}

/// Compares a merged checkpoint with base + the weighted deltas of the adapters.
fn check_merged(base: &Checkpoint, merged: &Checkpoint, adapters: &[(&Adapter, f64)]) {
    let mut deltas: HashMap<String, (Vec<f64>, Vec<f64>)> = HashMap::new();
    for (adapter, weight) in adapters {
        for module in adapter.modules() {
            let (d, m) = lora_delta(module, *weight);
            let entry = deltas.entry(base_name(module)).or_insert_with(|| (vec![0.0; d.len()], vec![0.0; d.len()]));
            for i in 0..d.len() {
                entry.0[i] += d[i];
                entry.1[i] += m[i];
            }
        }
    }
    assert_eq!(merged.len(), base.len());
    for info in base.tensors() {
        let mi = merged.find(info.name).unwrap();
        let Some((delta, magnitude)) = deltas.get(info.name) else {
            assert_eq!(merged.view(mi).unwrap(), base.view(info.index).unwrap(), "untargeted {} changed", info.name);
            continue;
        };
        let w = base.read_as::<f32>(info.index).unwrap();
        let got = merged.read_as::<f32>(mi).unwrap();
        let mut changed = 0;
        for i in 0..w.len() {
            let want = f64::from(w[i]) + delta[i];
            // Adapters merged one after the other round once per adapter.
            let bound = adapters.len() as f64 * (f64::from(w[i]).abs() + magnitude[i]);
            assert!(close_to(got[i], want, bound), "{}[{i}] = {}, want {want} (base {})", info.name, got[i], w[i]);
            changed += usize::from(got[i] != w[i]);
        }
        assert!(changed > 0, "{} did not change", info.name);
    }
}

#[test]
fn checkpoint_merge_adds_the_lora_delta() {
    let base_dir = fixture(&["models", "llama"]);
    let adapter_dir = fixture(&["adapters", "llama_lora"]);
    let tmp = TempDir::new("merge");
    let out = tmp.join("merged");
    let mut options = MergeOptions::new().unwrap();
    options.add_adapter_dir(&adapter_dir, 1.0).unwrap();
    let mut calls = Vec::new();
    let mut total = 0;
    let result = merge_checkpoint_with_progress(&base_dir, &out, &mut options, |done, all| {
        calls.push(done);
        total = all;
        ControlFlow::Continue(())
    })
    .unwrap();
    let adapter = Adapter::open_with_base(&adapter_dir, &base_dir).unwrap();
    let base = Checkpoint::open(&base_dir).unwrap();
    let merged = Checkpoint::open(&out).unwrap();
    assert_eq!(result.merged(), adapter.module_count() as u64);
    assert_eq!((result.replaced(), result.added()), (0, 0));
    assert_eq!(result.merged() + result.copied(), base.len() as u64);
    assert!(!result.untied_embeddings());
    for f in ["model.safetensors", "config.json", "generation_config.json"] {
        assert!(result.files().contains(&f), "{:?} lacks {f}", result.files());
    }
    assert_eq!(result.files()[0], "model.safetensors"); // weight files first
    assert_eq!(std::fs::read(out.join("config.json")).unwrap(), std::fs::read(base_dir.join("config.json")).unwrap());
    // Progress: 0 first, never decreasing, total at the end, total = bytes written.
    assert!(calls.len() >= 2 && calls[0] == 0, "{calls:?}");
    assert!(calls.windows(2).all(|w| w[0] <= w[1]), "{calls:?}");
    assert_eq!((*calls.last().unwrap(), total), (total, result.bytes()));
    check_merged(&base, &merged, &[(&adapter, 1.0)]);
    // The same options merge again without a callback, to the same bytes.
    let again = tmp.join("again");
    merge_checkpoint(&base_dir, &again, &options).unwrap();
    assert_eq!(
        std::fs::read(again.join("model.safetensors")).unwrap(),
        std::fs::read(out.join("model.safetensors")).unwrap()
    );
}

#[test]
fn weighted_adapters_merge_in_order() {
    let base_dir = fixture(&["models", "llama"]);
    let a1 = Adapter::open(fixture(&["adapters", "llama_lora"])).unwrap();
    let a2 = Adapter::open(fixture(&["adapters", "llama_lora_second"])).unwrap();
    let tmp = TempDir::new("merge-weighted");
    let mut options = MergeOptions::new().unwrap();
    options.add_adapter(&a1, 0.7).unwrap().add_adapter(&a2, -0.3).unwrap();
    merge_checkpoint(&base_dir, tmp.join("out"), &options).unwrap();
    let base = Checkpoint::open(&base_dir).unwrap();
    check_merged(&base, &Checkpoint::open(tmp.join("out")).unwrap(), &[(&a1, 0.7), (&a2, -0.3)]);
}

#[test]
fn options_keep_their_adapters_alive() {
    let base_dir = fixture(&["models", "llama"]);
    let mut options = MergeOptions::new().unwrap();
    {
        let adapter = Adapter::open(fixture(&["adapters", "llama_lora"])).unwrap();
        options.add_adapter(&adapter, 1.0).unwrap();
    } // the adapter handle is gone; the options hold the adapter
    let tmp = TempDir::new("merge-alive");
    let result = merge_checkpoint(&base_dir, tmp.join("out"), &options).unwrap();
    assert!(result.merged() > 0);
}

#[test]
fn output_dtype_shards_and_threads() {
    let base_dir = fixture(&["models", "llama"]);
    let adapter_dir = fixture(&["adapters", "llama_lora"]);
    let tmp = TempDir::new("merge-dtype");
    let mut f32_options = MergeOptions::new().unwrap();
    f32_options.add_adapter_dir(&adapter_dir, 1.0).unwrap().set_threads(1).unwrap();
    merge_checkpoint(&base_dir, tmp.join("f32"), &f32_options).unwrap();
    let mut options = MergeOptions::new().unwrap();
    options.add_adapter_dir(&adapter_dir, 1.0).unwrap().set_dtype(Some(DType::BF16)).unwrap();
    options.set_max_shard_size(8 * 1024).unwrap().set_threads(3).unwrap();
    let result = merge_checkpoint(&base_dir, tmp.join("bf16"), &options).unwrap();

    let shards: Vec<&str> = result.files().into_iter().filter(|f| f.ends_with(".safetensors")).collect();
    assert!(shards.len() > 1 && shards.iter().all(|s| s.starts_with("model-0000")), "{shards:?}");
    assert!(tmp.join("bf16").join("model.safetensors.index.json").exists());
    let config = read_json(&tmp.join("bf16").join("config.json"));
    let dtype = config.get("dtype").or_else(|| config.get("torch_dtype")).unwrap();
    assert_eq!(dtype, "bfloat16");

    // A tensor that changes dtype is computed in f32 and rounded once: the F32 merge, rounded.
    let f32_merged = Checkpoint::open(tmp.join("f32")).unwrap();
    let bf16_merged = Checkpoint::open(tmp.join("bf16")).unwrap();
    assert_eq!(bf16_merged.file_count(), shards.len());
    for info in f32_merged.tensors() {
        let other = bf16_merged.tensor_by_name(info.name).unwrap();
        assert_eq!(other.dtype, Some(DType::BF16));
        let want = f32_merged.read(info.index, DType::BF16).unwrap();
        assert_eq!(bf16_merged.view(other.index).unwrap(), want.as_slice(), "{}", info.name);
    }
    expect_code(options.set_dtype(Some(DType::I32)), ErrorCode::InvalidArgument);
}

#[test]
fn progress_cancels_the_merge() {
    let base_dir = fixture(&["models", "llama"]);
    let tmp = TempDir::new("merge-cancel");
    let out = tmp.join("cancelled");
    let mut options = MergeOptions::new().unwrap();
    options.add_adapter_dir(fixture(&["adapters", "llama_lora"]), 1.0).unwrap();
    let mut calls = 0;
    let err = expect_code(
        merge_checkpoint_with_progress(&base_dir, &out, &mut options, |_, _| {
            calls += 1;
            if calls == 2 {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        }),
        ErrorCode::Cancelled,
    );
    assert_eq!(calls, 2, "the callback ran after it cancelled ({err})");
    assert!(!out.exists(), "the cancelled merge left its output folder");

    // An existing output folder keeps its content.
    let keep = tmp.join("existing");
    std::fs::create_dir(&keep).unwrap();
    std::fs::write(keep.join("model.safetensors"), b"old").unwrap();
    expect_code(
        merge_checkpoint_with_progress(&base_dir, &keep, &mut options, |done, _| {
            if done > 0 {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        }),
        ErrorCode::Cancelled,
    );
    assert_eq!(list_files(&keep), ["model.safetensors"]);
    assert_eq!(std::fs::read(keep.join("model.safetensors")).unwrap(), b"old");

    // The callback was removed from the options: the next merge runs without it.
    merge_checkpoint(&base_dir, &out, &options).unwrap();
}

#[test]
fn a_panicking_progress_callback_is_resumed() {
    let tmp = TempDir::new("merge-panic");
    let out = tmp.join("panicked");
    let mut options = MergeOptions::new().unwrap();
    options.add_adapter_dir(fixture(&["adapters", "llama_lora"]), 1.0).unwrap();
    let payload = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let _ = merge_checkpoint_with_progress(fixture(&["models", "llama"]), &out, &mut options, |_, _| {
            panic!("progress failed")
        });
    }))
    .expect_err("the panic was swallowed");
    assert_eq!(payload.downcast_ref::<&str>(), Some(&"progress failed"));
    assert!(!out.exists(), "output left behind");
    merge_checkpoint(fixture(&["models", "llama"]), &out, &options).unwrap();
}

#[test]
fn merge_errors() {
    let base = fixture(&["models", "llama"]);
    let tmp = TempDir::new("merge-errors");
    let lora = fixture(&["adapters", "llama_lora"]);
    let empty = MergeOptions::new().unwrap();
    expect_code(merge_checkpoint(&base, tmp.join("a"), &empty), ErrorCode::InvalidArgument); // no adapters
    let mut options = MergeOptions::new().unwrap();
    options.add_adapter_dir(&lora, 1.0).unwrap();
    expect_code(merge_checkpoint(&base, &base, &options), ErrorCode::InvalidArgument); // out = base
    let mut gpt2 = MergeOptions::new().unwrap();
    gpt2.add_adapter_dir(fixture(&["adapters", "gpt2_lora"]), 1.0).unwrap();
    let err = merge_checkpoint(&base, tmp.join("b"), &gpt2).unwrap_err();
    assert!(matches!(err.code(), ErrorCode::UnresolvedKey | ErrorCode::ShapeMismatch), "{err}");
    expect_code(
        MergeOptions::new().unwrap().add_adapter_dir(&lora, f64::INFINITY).map(|_| ()),
        ErrorCode::InvalidArgument,
    );
    expect_code(MergeOptions::new().unwrap().add_adapter_dir("", 1.0).map(|_| ()), ErrorCode::InvalidArgument);
    assert!(merge_checkpoint(tmp.join("absent"), tmp.join("c"), &options).is_err());
    expect_code(merge_checkpoint(&base, "f\0", &options), ErrorCode::InvalidArgument);
    assert!(list_files(tmp.path()).is_empty(), "failed merges left {:?}", list_files(tmp.path()));
}

/// A base folder without config.json is refused unless `set_require_config(false)` says it is not needed.
#[test]
fn require_config() {
    let tmp = TempDir::new("merge-require-config");
    let base = tmp.join("base");
    std::fs::create_dir(&base).unwrap();
    std::fs::copy(fixture(&["models", "llama", "model.safetensors"]), base.join("model.safetensors")).unwrap();
    let out = tmp.join("out");
    let mut options = MergeOptions::new().unwrap();
    options.add_adapter_dir(fixture(&["adapters", "llama_lora"]), 1.0).unwrap();
    let err = expect_code(merge_checkpoint(&base, &out, &options), ErrorCode::NotFound);
    assert!(err.message().contains("config.json"), "{err}");
    assert!(!out.exists(), "a refused merge wrote its output folder");
    let result = merge_checkpoint(&base, &out, options.set_require_config(false).unwrap()).unwrap();
    assert!(!result.files().contains(&"config.json"), "{:?}", result.files());
    assert!(out.join("model.safetensors").exists() && !out.join("config.json").exists());
}

/// lora_alpha 4e12 overflows F16: refused by default, written as computed with `set_allow_nonfinite(true)`.
#[test]
fn allow_nonfinite() {
    let tmp = TempDir::new("merge-allow-nonfinite");
    let adapter = tmp.join("adapter");
    std::fs::create_dir(&adapter).unwrap();
    let source = fixture(&["adapters", "llama_lora"]);
    let mut config = read_json(&source.join("adapter_config.json"));
    config["lora_alpha"] = serde_json::json!(4e12);
    std::fs::write(adapter.join("adapter_config.json"), config.to_string()).unwrap();
    std::fs::copy(source.join("adapter_model.safetensors"), adapter.join("adapter_model.safetensors")).unwrap();
    let (base, out) = (fixture(&["models", "llama"]), tmp.join("out"));
    let mut options = MergeOptions::new().unwrap();
    options.add_adapter_dir(&adapter, 1.0).unwrap().set_dtype(Some(DType::F16)).unwrap();
    expect_code(merge_checkpoint(&base, &out, &options), ErrorCode::NonFinite);
    assert!(!out.exists(), "a refused merge wrote its output folder");
    merge_checkpoint(&base, &out, options.set_allow_nonfinite(true).unwrap()).unwrap();
    assert!(out.join("model.safetensors").exists());
}

#[test]
fn replaced_embeddings_and_untying_are_reported() {
    let tmp = TempDir::new("merge-embedding");
    let out = tmp.join("merged");
    let mut options = MergeOptions::new().unwrap();
    options.add_adapter_dir(fixture(&["adapters", "llama_embedding"]), 1.0).unwrap();
    let result = merge_checkpoint(fixture(&["models", "llama"]), &out, &options).unwrap();
    let config = read_json(&out.join("config.json"));
    if result.untied_embeddings() {
        assert_eq!(config["tie_word_embeddings"], false);
        assert!(!result.notes().is_empty());
    }
    assert!(result.merged() + result.replaced() > 0, "{result:?}");
    assert!(format!("{result:?}").contains("merged"));
}

fn read_f32(ckpt: &Checkpoint, name: &str) -> (Vec<f32>, Vec<u64>) {
    let info = ckpt.tensor_by_name(name).unwrap();
    (ckpt.read_as::<f32>(info.index).unwrap(), info.shape.to_vec())
}

#[test]
fn buffer_merge_matches_the_checkpoint_merge_and_restores_exactly() {
    let base_dir = fixture(&["models", "llama"]);
    let tmp = TempDir::new("buffer");
    let mut options = MergeOptions::new().unwrap();
    options.add_adapter_dir(fixture(&["adapters", "llama_lora"]), 0.5).unwrap();
    merge_checkpoint(&base_dir, tmp.join("merged"), &options).unwrap();
    let adapter = Adapter::open(fixture(&["adapters", "llama_lora"])).unwrap();
    let (base, merged) = (Checkpoint::open(&base_dir).unwrap(), Checkpoint::open(tmp.join("merged")).unwrap());
    let mut buffer_options = MergeBufferOptions::new().unwrap();
    buffer_options.set_weight(0.5).unwrap().set_keep_original_rows(true).unwrap();
    for module in adapter.modules() {
        let name = base_name(module);
        let (mut w, shape) = read_f32(&base, &name);
        let original = w.clone();
        let mut record =
            merge_into(&adapter, module.name(), Buffer::F32(&mut w), &shape, None, Some(&buffer_options)).unwrap();
        assert_eq!(w, read_f32(&merged, &name).0, "{}: buffer merge differs from the checkpoint merge", module.name());
        assert_eq!(record.module(), module.name());
        assert!(record.is_active() && record.saved_bytes() > 0, "{record:?}");
        let mut moved = w.clone(); // the buffer may move between merge and removal
        record.remove(Buffer::F32(&mut moved), None).unwrap();
        assert!(moved == original && !record.is_active(), "{}: removal did not restore the original", module.name());
        expect_code(record.remove(Buffer::F32(&mut moved), None), ErrorCode::InvalidArgument);
        // spent
    }
}

#[test]
fn buffer_merge_arithmetic_removal_and_bf16() {
    let base = Checkpoint::open(fixture(&["models", "llama"])).unwrap();
    let adapter = Adapter::open(fixture(&["adapters", "llama_lora"])).unwrap();
    let name = "model.layers.0.self_attn.q_proj.weight";
    let (mut w, shape) = read_f32(&base, name);
    let original = w.clone();
    // A tensor name with the PEFT prefix works as well as a module path.
    let mut record =
        merge_into(&adapter, &format!("base_model.model.{name}"), Buffer::F32(&mut w), &shape, None, None).unwrap();
    assert_eq!(record.saved_bytes(), 0, "rows kept without the option");
    record.remove(Buffer::F32(&mut w), None).unwrap();
    let (_, magnitude) = lora_delta(adapter.find_module("model.layers.0.self_attn.q_proj").unwrap(), 1.0);
    for i in 0..w.len() {
        // Merge and unmerge each round once.
        let bound = 2.0 * (f64::from(original[i]).abs() + 2.0 * magnitude[i]);
        assert!(
            close_to(w[i], f64::from(original[i]), bound),
            "element {i}: {} after unmerge, was {}",
            w[i],
            original[i]
        );
    }

    // BF16 with kept rows: restored bit for bit; the merge itself equals the F32 merge of the
    // widened values rounded once, to within one BF16 ulp (the F32 result may sit next to a tie).
    let raw: Vec<u8> = original.iter().flat_map(|v| v.to_le_bytes()).collect();
    let mut bf_bytes = vec![0u8; raw.len() / 2];
    peft_c::convert(DType::F32, &raw, DType::BF16, &mut bf_bytes).unwrap();
    let mut bf: Vec<u16> = bf_bytes.chunks_exact(2).map(|c| u16::from_le_bytes([c[0], c[1]])).collect();
    let bf_original = bf.clone();
    let mut widened_bytes = vec![0u8; raw.len()];
    peft_c::convert(DType::BF16, &bf_bytes, DType::F32, &mut widened_bytes).unwrap();
    let mut widened = common::f32s(&widened_bytes);
    let mut keep = MergeBufferOptions::new().unwrap();
    keep.set_keep_original_rows(true).unwrap();
    let mut record = merge_into(&adapter, name, Buffer::BF16(&mut bf), &shape, None, Some(&keep)).unwrap();
    drop(merge_into(&adapter, name, Buffer::F32(&mut widened), &shape, None, None).unwrap());
    let widened_raw: Vec<u8> = widened.iter().flat_map(|v| v.to_le_bytes()).collect();
    let mut want = vec![0u8; bf_bytes.len()];
    peft_c::convert(DType::F32, &widened_raw, DType::BF16, &mut want).unwrap();
    for (i, c) in want.chunks_exact(2).enumerate() {
        let want = u16::from_le_bytes([c[0], c[1]]);
        assert!((i32::from(bf[i]) - i32::from(want)).abs() <= 1, "bf16 element {i}: {:#06x} vs {want:#06x}", bf[i]);
    }
    assert_ne!(bf, bf_original);
    expect_code(record.remove(Buffer::F16(&mut bf), None), ErrorCode::InvalidArgument); // another dtype
    record.remove(Buffer::BF16(&mut bf), None).unwrap();
    assert_eq!(bf, bf_original);
}

#[test]
fn buffer_merge_errors_change_nothing() {
    let adapter = Adapter::open(fixture(&["adapters", "llama_lora"])).unwrap();
    let layer = "model.layers.0.self_attn.q_proj";
    let mut w = vec![0f32; 16 * 16];
    expect_code(
        merge_into(&adapter, "model.layers.0.nothing", Buffer::F32(&mut w), &[16, 16], None, None),
        ErrorCode::NotFound,
    );
    // The buffer must hold exactly the shape's elements (checked by the binding).
    expect_code(merge_into(&adapter, layer, Buffer::F32(&mut w), &[16, 8], None, None), ErrorCode::InvalidArgument);
    expect_code(
        merge_into(&adapter, layer, Buffer::F32(&mut w), &[1 << 40, 1 << 40], None, None),
        ErrorCode::InvalidArgument,
    );
    expect_code(
        merge_into(&adapter, layer, Buffer::F32(&mut w[..128]), &[8, 16], None, None),
        ErrorCode::ShapeMismatch,
    );
    expect_code(MergeBufferOptions::new().unwrap().set_weight(f64::NAN).map(|_| ()), ErrorCode::InvalidArgument);
    expect_code(merge_into(&adapter, "a\0b", Buffer::F32(&mut w), &[16, 16], None, None), ErrorCode::InvalidArgument);
    assert!(w.iter().all(|v| *v == 0.0), "a failed merge changed the buffer");
    let mut record = merge_into(&adapter, layer, Buffer::F32(&mut w), &[16, 16], None, None).unwrap();
    expect_code(record.remove(Buffer::F32(&mut w[..128]), None), ErrorCode::InvalidArgument); // another length
    assert!(record.is_active());
}

#[test]
fn buffer_merge_with_lora_bias() {
    let base_dir = fixture(&["models", "qwen2"]);
    let base = Checkpoint::open(&base_dir).unwrap();
    let adapter = Adapter::open_with_base(fixture(&["adapters", "qwen2_lora_bias"]), &base_dir).unwrap();
    let module = adapter.modules().find(|m| m.tensor_by_role("lora_B.bias").is_some()).expect("a lora_B.bias");
    let bias_name = module.tensor_by_role("lora_B.bias").unwrap().base_name().to_string();
    let (mut w, shape) = read_f32(&base, &base_name(module));
    let (mut b, _) = read_f32(&base, &bias_name);
    let (w0, b0) = (w.clone(), b.clone());
    expect_code(
        merge_into(&adapter, module.name(), Buffer::F32(&mut w), &shape, None, None),
        ErrorCode::InvalidArgument,
    );
    let short = b.len() - 1;
    expect_code(
        merge_into(&adapter, module.name(), Buffer::F32(&mut w), &shape, Some(Buffer::F32(&mut b[..short])), None),
        ErrorCode::InvalidArgument,
    );
    assert!(w == w0 && b == b0, "a failed merge changed a buffer");
    let mut keep = MergeBufferOptions::new().unwrap();
    keep.set_keep_original_rows(true).unwrap();
    let mut record =
        merge_into(&adapter, module.name(), Buffer::F32(&mut w), &shape, Some(Buffer::F32(&mut b)), Some(&keep))
            .unwrap();
    let lora_bias = module.tensor_by_role("lora_B.bias").unwrap().read_as::<f32>().unwrap();
    for i in 0..b.len() {
        let want = f64::from(b0[i]) + module.scaling() * f64::from(lora_bias[i]);
        assert!(close_to(b[i], want, want.abs() + 1e-6), "bias[{i}] = {}, want {want}", b[i]);
    }
    // The checkpoint merge writes the same weight and bias.
    let tmp = TempDir::new("buffer-bias");
    let mut options = MergeOptions::new().unwrap();
    options.add_adapter(&adapter, 1.0).unwrap();
    merge_checkpoint(&base_dir, tmp.join("merged"), &options).unwrap();
    let merged = Checkpoint::open(tmp.join("merged")).unwrap();
    assert_eq!(read_f32(&merged, &bias_name).0, b);
    assert_eq!(read_f32(&merged, &base_name(module)).0, w);
    // Removal needs the bias again, of the same length.
    expect_code(record.remove(Buffer::F32(&mut w), Some(Buffer::F32(&mut b[..short]))), ErrorCode::InvalidArgument);
    record.remove(Buffer::F32(&mut w), Some(Buffer::F32(&mut b))).unwrap();
    assert!(w == w0 && b == b0);
}

#[test]
fn buffer_merge_by_host_names() {
    let base = Checkpoint::open(fixture(&["models", "llama"])).unwrap();
    let adapter = Adapter::open(fixture(&["adapters", "llama_lora"])).unwrap();
    let translator = adapter.translator().unwrap();
    let name = "model.layers.1.mlp.down_proj.weight";
    let native = translator.to_native(name).unwrap();
    let (mut w1, shape) = read_f32(&base, name);
    let mut w2 = w1.clone();
    let mut options = MergeBufferOptions::new().unwrap();
    options.set_translator(Some(&translator)).unwrap();
    drop(translator); // the options share the table
    drop(merge_into(&adapter, &native, Buffer::F32(&mut w1), &shape, None, Some(&options)).unwrap());
    drop(merge_into(&adapter, name, Buffer::F32(&mut w2), &shape, None, None).unwrap());
    assert_eq!(w1, w2, "native and HF names merged differently");
    expect_code(
        merge_into(&adapter, "no/such/layer", Buffer::F32(&mut w1), &shape, None, Some(&options)),
        ErrorCode::UnresolvedKey,
    );
}

#[test]
fn buffer_merges_run_concurrently() {
    let base = Checkpoint::open(fixture(&["models", "llama"])).unwrap();
    let adapter = Adapter::open(fixture(&["adapters", "llama_lora"])).unwrap();
    let mut single = MergeBufferOptions::new().unwrap();
    single.set_threads(1).unwrap();
    let expected: Vec<(String, Vec<u64>, Vec<f32>)> = adapter
        .modules()
        .map(|m| {
            let (mut w, shape) = read_f32(&base, &base_name(m));
            drop(merge_into(&adapter, m.name(), Buffer::F32(&mut w), &shape, None, Some(&single)).unwrap());
            (m.name().to_string(), shape, w)
        })
        .collect();
    std::thread::scope(|scope| {
        for _ in 0..8 {
            scope.spawn(|| {
                for (module, shape, want) in &expected {
                    let m = adapter.find_module(module).unwrap();
                    let (mut w, _) = read_f32(&base, &base_name(m));
                    let record = merge_into(&adapter, module, Buffer::F32(&mut w), shape, None, None).unwrap();
                    assert!(&w == want, "concurrent merge of {module} differs");
                    // A record may move to another thread.
                    std::thread::spawn(move || drop(record)).join().unwrap();
                }
            });
        }
    });
}

/// A LoRA on the tied lm_head of the gemma fixture (vocabulary 64, hidden 16).
fn write_lm_head_adapter(dir: &std::path::Path) {
    std::fs::create_dir_all(dir).unwrap();
    let config =
        r#"{"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": 2, "lora_alpha": 2, "target_modules": ["lm_head"]}"#;
    std::fs::write(dir.join("adapter_config.json"), config).unwrap();
    let mut writer = Writer::new(dir.join("adapter_model.safetensors")).unwrap();
    let factors =
        [("base_model.model.lm_head.lora_A.weight", [2u64, 16]), ("base_model.model.lm_head.lora_B.weight", [64, 2])];
    for (name, shape) in &factors {
        writer.add_tensor(name, DType::F32, shape).unwrap();
    }
    writer.start().unwrap();
    for (name, shape) in &factors {
        let values: Vec<f32> = (0..shape[0] * shape[1]).map(|i| ((i % 5) as f32 - 2.0) * 0.125).collect();
        writer.write_tensor_as(name, &values).unwrap();
    }
    writer.finish().unwrap();
}

#[test]
fn tied_embeddings_policy() {
    let tmp = TempDir::new("tied");
    let adapter = tmp.join("lm_head");
    write_lm_head_adapter(&adapter);
    let base = fixture(&["models", "gemma"]);
    let tied = |out: &std::path::Path| read_json(&out.join("config.json"))["tie_word_embeddings"] == true;
    // The default unties: lm_head.weight added, tie_word_embeddings false.
    let mut options = MergeOptions::new().unwrap();
    options.add_adapter_dir(&adapter, 1.0).unwrap();
    assert_eq!(TiedEmbeddings::default(), TiedEmbeddings::Untie);
    let result = merge_checkpoint(&base, tmp.join("untie"), &options).unwrap();
    assert!(result.untied_embeddings());
    assert_eq!(result.added(), 1);
    assert!(!tied(&tmp.join("untie")));
    // Shared: the change lands in the shared embedding, which stays tied.
    options.set_tied_embeddings(TiedEmbeddings::Shared).unwrap();
    let result = merge_checkpoint(&base, tmp.join("shared"), &options).unwrap();
    assert!(!result.untied_embeddings());
    assert_eq!((result.added(), result.merged()), (0, 1));
    assert!(tied(&tmp.join("shared")));
    // And back.
    options.set_tied_embeddings(TiedEmbeddings::Untie).unwrap();
    assert!(merge_checkpoint(&base, tmp.join("again"), &options).unwrap().untied_embeddings());
}
