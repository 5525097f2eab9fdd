//! Adapters as PEFT wrote them (config values, every tensor under a module with its bytes, the
//! scaling PEFT computes), open and validation errors, translators (round trips, batches,
//! built-in and own tables, detection).

mod common;

use std::path::{Path, PathBuf};

use common::{expect_code, fixture, fixtures, read_json, TempDir};
use peft_c::{Adapter, AdapterOptions, Checkpoint, DType, ErrorCode, LayerKind, Module, Registry, Translator};
use serde_json::Value;

fn manifest() -> Vec<(String, Value)> {
    let m = read_json(&fixture(&["adapters", "MANIFEST.json"]));
    let entries: Vec<(String, Value)> = m.as_object().unwrap().iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    assert!(entries.len() >= 20, "only {} adapters in the manifest", entries.len());
    entries
}

fn copy_dir(src: &Path, dst: &Path) {
    std::fs::create_dir_all(dst).unwrap();
    for entry in std::fs::read_dir(src).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), dst.join(entry.file_name())).unwrap();
    }
}

/// Recomputes a LoRA module's rank and scaling from its tensors and the config, as PEFT does.
fn check_scaling(adapter: &Adapter, module: Module<'_>) {
    if !module.kind().is_lora() {
        assert_eq!((module.rank(), module.scaling()), (0, 0.0), "{module:?}");
        return;
    }
    let a = module
        .tensor_by_role("lora_A.weight")
        .or_else(|| module.tensor_by_role("lora_embedding_A"))
        .unwrap_or_else(|| panic!("LoRA module {} has no A factor", module.name()));
    // LoRA on stacked expert parameters (target_parameters): lora_A holds rank rows per expert.
    let rows = a.shape()[0] as i64;
    let stacked = adapter.config_field("target_parameters").is_some_and(|v| v != "null" && v != "[]");
    assert!(
        rows == module.rank() || (stacked && rows % module.rank() == 0),
        "{}: rank {} for {rows} rows",
        module.name(),
        module.rank()
    );
    let r = module.rank() as f64;
    let want = if adapter.use_rslora() { module.alpha() / r.sqrt() } else { module.alpha() / r };
    assert!(
        (module.scaling() - want).abs() <= 1e-12 * want.abs(),
        "{}: scaling {} want {want}",
        module.name(),
        module.scaling()
    );
}

fn check_adapter(name: &str, adapter: &Adapter, dir: &Path, m: &Value) {
    let config = read_json(&dir.join("adapter_config.json"));
    assert_eq!(adapter.r(), m["r"].as_i64().unwrap(), "{name}: r");
    assert_eq!(adapter.lora_alpha(), m["lora_alpha"].as_f64().unwrap(), "{name}: lora_alpha");
    assert_eq!(adapter.use_rslora(), m["use_rslora"].as_bool().unwrap(), "{name}");
    assert_eq!(adapter.use_dora(), m["use_dora"].as_bool().unwrap(), "{name}");
    assert_eq!(adapter.task_type(), m["task_type"].as_str(), "{name}: task_type");
    assert_eq!(adapter.peft_type(), "LORA");
    assert_eq!(adapter.bias(), config["bias"].as_str().unwrap());
    assert_eq!(adapter.base_model_name_or_path(), config["base_model_name_or_path"].as_str());
    assert_eq!(adapter.lora_bias(), config["lora_bias"] == Value::Bool(true));
    assert_eq!(adapter.fan_in_fan_out(), config["fan_in_fan_out"] == Value::Bool(true));
    let from_lib: Value = serde_json::from_str(adapter.config_json()).unwrap();
    assert_eq!(from_lib, config, "{name}: config_json");
    for (field, value) in config.as_object().unwrap() {
        let got = adapter.config_field(field).unwrap_or_else(|| panic!("{name}: field {field} missing"));
        assert_eq!(&serde_json::from_str::<Value>(got).unwrap(), value, "{name}: field {field}");
    }
    assert_eq!(adapter.config_field("no_such_field"), None);

    let file = Checkpoint::open(dir.join("adapter_model.safetensors")).unwrap();
    let mut seen = std::collections::HashSet::new();
    assert_eq!(adapter.modules().len(), adapter.module_count());
    for module in adapter.modules() {
        assert_eq!(adapter.find_module(module.name()).unwrap().index(), module.index());
        assert_eq!(adapter.module(module.index()).unwrap().name(), module.name());
        check_scaling(adapter, module);
        for tensor in module.tensors() {
            let info = file.tensor_by_name(tensor.key()).unwrap_or_else(|e| panic!("{name}: {}: {e}", tensor.key()));
            assert_eq!(info.dtype, tensor.dtype(), "{}", tensor.key());
            assert_eq!(info.shape, tensor.shape(), "{}", tensor.key());
            assert!(seen.insert(tensor.key().to_string()), "{} twice", tensor.key());
            assert!(!tensor.role().is_empty() && tensor.key().ends_with(tensor.role()), "{tensor:?}");
            assert!(!tensor.base_name().is_empty(), "{tensor:?}");
            assert_eq!(
                tensor.read(info.dtype.unwrap()).unwrap(),
                file.view(info.index).unwrap(),
                "{}: bytes",
                tensor.key()
            );
        }
        assert_eq!(module.kind() == LayerKind::TrainableTokens, !module.token_indices().is_empty(), "{module:?}");
    }
    assert_eq!(seen.len(), file.len(), "{name}: modules hold {} of the file's {} tensors", seen.len(), file.len());
    assert_eq!(seen.len() as u64, m["tensors"].as_u64().unwrap());
}

#[test]
fn adapters_match_what_peft_wrote() {
    for (name, m) in manifest() {
        let dir = fixture(&[m["path"].as_str().unwrap()]);
        let base = fixture(&[m["base"].as_str().unwrap()]);
        let opened = Adapter::open_with_base(&dir, &base);
        let adapter = opened.unwrap_or_else(|e| panic!("{name}: {e}"));
        check_adapter(&name, &adapter, &dir, &m);
    }
}

#[test]
fn rank_and_alpha_patterns_give_several_ranks() {
    let dir = fixture(&["adapters", "llama_rank_alpha_pattern"]);
    let adapter = Adapter::open(&dir).unwrap();
    let config = read_json(&dir.join("adapter_config.json"));
    let ranks: std::collections::BTreeSet<i64> = adapter.modules().map(|m| m.rank()).collect();
    assert!(!config["rank_pattern"].as_object().unwrap().is_empty() && ranks.len() >= 2, "{ranks:?}");
    let alphas: std::collections::BTreeSet<u64> = adapter.modules().map(|m| m.alpha().to_bits()).collect();
    assert!(alphas.len() >= 2);
}

#[test]
fn adapter_open_errors() {
    let tmp = TempDir::new("adapter-errors");
    expect_code(Adapter::open(tmp.join("absent")), ErrorCode::NotFound);
    expect_code(Adapter::open("x\0y"), ErrorCode::InvalidArgument);
    let src = fixture(&["adapters", "llama_lora"]);

    let broken = tmp.join("broken");
    copy_dir(&src, &broken);
    std::fs::write(broken.join("adapter_config.json"), r#"{"peft_type": "LORA", "r": 4"#).unwrap();
    expect_code(Adapter::open(&broken), ErrorCode::InvalidConfig);

    std::fs::write(broken.join("adapter_config.json"), r#"{"peft_type": "LORA", "r": "four"}"#).unwrap();
    expect_code(Adapter::open(&broken), ErrorCode::InvalidConfig);

    let pickle = tmp.join("pickle");
    std::fs::create_dir(&pickle).unwrap();
    std::fs::copy(src.join("adapter_config.json"), pickle.join("adapter_config.json")).unwrap();
    std::fs::write(pickle.join("adapter_model.bin"), b"PK").unwrap();
    expect_code(Adapter::open(&pickle), ErrorCode::Unsupported);

    let damaged = tmp.join("damaged");
    copy_dir(&src, &damaged);
    std::fs::write(damaged.join("adapter_model.safetensors"), [1u8, 2, 3]).unwrap();
    expect_code(Adapter::open(&damaged), ErrorCode::HeaderTooSmall);

    let err = Adapter::open_with_base(&src, fixture(&["models", "gpt2"])).unwrap_err();
    assert!(matches!(err.code(), ErrorCode::UnresolvedKey | ErrorCode::ShapeMismatch), "{err}");
}

#[test]
fn adapter_validation() {
    let adapter = Adapter::open(fixture(&["adapters", "llama_lora"])).unwrap();
    adapter.validate(fixture(&["models", "llama"])).unwrap();
    adapter.validate(fixture(&["models", "llama_f16"])).unwrap(); // same shapes
    let err = adapter.validate(fixture(&["models", "gpt2"])).unwrap_err();
    assert!(matches!(err.code(), ErrorCode::UnresolvedKey | ErrorCode::ShapeMismatch), "{err}");
    let err = adapter.validate(fixture(&["models", "absent"])).unwrap_err();
    assert!(matches!(err.code(), ErrorCode::NotFound | ErrorCode::Io), "{err}");
    expect_code(adapter.validate("a\0"), ErrorCode::InvalidArgument);
}

#[test]
fn module_lookup_errors_and_token_indices() {
    let dir = fixture(&["adapters", "llama_trainable_tokens"]);
    let adapter = Adapter::open(&dir).unwrap();
    expect_code(adapter.find_module("model.nothing"), ErrorCode::NotFound);
    assert!(adapter.module(adapter.module_count()).is_none());
    let module = adapter.module(0).unwrap();
    assert!(module.tensor(module.tensor_count()).is_none());
    let tensor = module.tensor(0).unwrap();
    expect_code(tensor.read_into(DType::F32, &mut [0u8; 3]), ErrorCode::InvalidArgument);
    expect_code(tensor.read(DType::I8), ErrorCode::Unsupported);
    let tokens = adapter.modules().find(|m| m.kind() == LayerKind::TrainableTokens).expect("a trainable-tokens module");
    let config = read_json(&dir.join("adapter_config.json"));
    let listed = config["trainable_token_indices"].to_string();
    for index in tokens.token_indices() {
        assert!(listed.contains(&index.to_string()), "token {index} is not in {listed}");
    }
    let rows = tokens.tensor(0).unwrap().read_as::<f32>().unwrap();
    assert!(!rows.is_empty());
    assert_eq!(LayerKind::from_raw(42), LayerKind::Unknown(42));
}

/// Writes a copy of `src` whose keys carry PEFT's adapter name (`lora_A.default.weight`), as
/// adapters saved from an unmerged multi-adapter model sometimes do.
fn with_adapter_name_in_keys(src: &Path, dst: &Path) {
    std::fs::create_dir_all(dst).unwrap();
    std::fs::copy(src.join("adapter_config.json"), dst.join("adapter_config.json")).unwrap();
    let file = Checkpoint::open(src.join("adapter_model.safetensors")).unwrap();
    let mut writer = peft_c::Writer::new(dst.join("adapter_model.safetensors")).unwrap();
    let rename = |name: &str| name.replace(".lora_A.", ".lora_A.default.").replace(".lora_B.", ".lora_B.default.");
    for t in file.tensors() {
        writer.add_tensor(&rename(t.name), t.dtype.unwrap(), t.shape).unwrap();
    }
    for (key, value) in file.metadata(0) {
        writer.set_metadata(key, value).unwrap();
    }
    writer.start().unwrap();
    for name in writer.order() {
        let original = name.replace(".default.", ".");
        let index = file.find(&original).unwrap();
        writer.write_from_checkpoint(&name, &file, index).unwrap();
    }
    writer.finish().unwrap();
}

#[test]
fn adapter_name_in_keys_is_removed_with_a_note() {
    let tmp = TempDir::new("adapter-name");
    let dir = tmp.join("named");
    let src = fixture(&["adapters", "llama_lora"]);
    with_adapter_name_in_keys(&src, &dir);
    let plain = Adapter::open(&src).unwrap();
    assert!(plain.notes().is_empty(), "{:?}", plain.notes());
    let named = Adapter::open(&dir).unwrap();
    let notes = named.notes();
    assert!(notes.iter().any(|n| n.contains("default")), "notes {notes:?}");
    assert_eq!(named.module_count(), plain.module_count());
    for (a, b) in named.modules().zip(plain.modules()) {
        assert_eq!(a.name(), b.name());
        assert!(a.tensors().all(|t| t.key().contains(".default.")));
    }
    // Exporting makes the keys canonical: the file PEFT wrote comes back, byte for byte.
    let out = tmp.join("canonical");
    named.export(&out, None).unwrap();
    assert_eq!(
        std::fs::read(out.join("adapter_model.safetensors")).unwrap(),
        std::fs::read(src.join("adapter_model.safetensors")).unwrap()
    );
}

#[test]
fn translator_round_trips_adapter_keys() {
    let adapter = Adapter::open(fixture(&["adapters", "llama_lora"])).unwrap();
    let tr = adapter.translator().unwrap();
    assert_eq!((tr.family(), adapter.family()), ("llama", Some("llama")));
    let file = Checkpoint::open(fixture(&["adapters", "llama_lora", "adapter_model.safetensors"])).unwrap();
    let keys: Vec<&str> = file.tensors().map(|t| t.name).collect();
    let natives = tr.to_native_batch(&keys).unwrap();
    let back = tr.to_hf_batch(&natives, true).unwrap();
    for (i, key) in keys.iter().enumerate() {
        let one = tr.to_native(key).unwrap();
        assert_eq!(one, natives[i]);
        assert!(one.contains('/'), "{one}");
        assert_eq!(tr.to_hf(&one, true).unwrap(), *key);
        assert_eq!(back[i], *key);
        assert_eq!(format!("base_model.model.{}", tr.to_hf(&one, false).unwrap()), *key);
    }
    expect_code(tr.to_native("model.no_such_module.weight"), ErrorCode::UnresolvedKey);
    let err = expect_code(tr.to_native_batch(&[keys[0], "nonsense.a", "nonsense.b"]), ErrorCode::UnresolvedKey);
    assert!(err.message().contains("nonsense.a") && err.message().contains("nonsense.b"), "{err}");
    expect_code(tr.to_hf("no/such/native/name", true), ErrorCode::UnresolvedKey);
    expect_code(tr.to_hf_batch(&["x\0"], true), ErrorCode::InvalidArgument);
    assert!(tr.to_native_batch::<&str>(&[]).unwrap().is_empty());
}

#[test]
fn builtin_own_and_detected_translators() {
    let families = Translator::builtin_families().unwrap();
    for want in ["llama", "gpt2", "bert"] {
        assert!(families.iter().any(|f| f == want), "{families:?} lack {want}");
    }
    assert!(families.windows(2).all(|w| w[0] < w[1]), "not sorted: {families:?}");
    for family in &families {
        assert_eq!(Translator::builtin(family).unwrap().family(), family);
    }
    expect_code(Translator::builtin("no_such_family"), ErrorCode::NotFound);
    expect_code(Translator::builtin("../etc"), ErrorCode::InvalidArgument);

    let llama = fixture(&["models", "llama"]);
    assert_eq!(Translator::detect(Some(&llama), None).unwrap().family(), "llama");
    assert_eq!(Translator::detect(None, Some("openai-community/gpt2")).unwrap().family(), "gpt2");
    expect_code(Translator::detect(None, None), ErrorCode::NotFound);

    let table: PathBuf = fixtures().join("../../data/arch/llama.json");
    let text = std::fs::read_to_string(&table).unwrap();
    let key = "base_model.model.model.layers.1.self_attn.q_proj.lora_A.weight";
    let want = Translator::builtin("llama").unwrap().to_native(key).unwrap();
    for own in [Translator::from_file(&table).unwrap(), Translator::from_json(&text).unwrap()] {
        assert_eq!(own.to_native(key).unwrap(), want);
    }
    expect_code(Translator::from_json("{"), ErrorCode::InvalidConfig);
    expect_code(Translator::from_file(fixture(&["absent.json"])), ErrorCode::Io);
}

#[test]
fn adapter_uses_an_explicit_translator() {
    let tr = Translator::builtin("llama").unwrap();
    let mut options = AdapterOptions::new().unwrap();
    options.set_translator(Some(&tr)).unwrap();
    drop(tr); // the options share the table
    let adapter = Adapter::open_with(fixture(&["adapters", "mistral_lora"]), &options).unwrap();
    assert_eq!(adapter.family(), Some("llama"));
    options.set_translator(None).unwrap().set_base_dir(None).unwrap();
    let detected = Adapter::open_with(fixture(&["adapters", "mistral_lora"]), &options).unwrap();
    assert_eq!(detected.family(), Some("mistral"));
}

/// llama_lora without "down_proj" in target_modules: strict opening refuses it; lenient opening
/// drops the four down_proj tensors, one warning each (PEFT's unexpected keys).
#[test]
fn lenient_loading_ignores_what_peft_ignores_and_lists_it() {
    let tmp = TempDir::new("lenient");
    let dir = tmp.join("adapter");
    let src = fixture(&["adapters", "llama_lora"]);
    copy_dir(&src, &dir);
    let config = std::fs::read_to_string(src.join("adapter_config.json")).unwrap();
    std::fs::write(dir.join("adapter_config.json"), config.replace("\"down_proj\",", "")).unwrap();

    expect_code(Adapter::open(&dir), ErrorCode::InvalidConfig);
    assert!(Adapter::open(&src).unwrap().warnings().is_empty());
    let mut options = AdapterOptions::new().unwrap();
    options.set_base_dir(Some(&fixture(&["models", "llama"]))).unwrap().set_lenient(true).unwrap();
    let adapter = Adapter::open_with(&dir, &options).unwrap();
    let warnings = adapter.warnings();
    assert_eq!(warnings.len(), 4, "{warnings:?}");
    for w in &warnings {
        assert!(w.starts_with("unexpected key \"base_model.model.model.layers."), "{w}");
        assert!(w.contains("mlp.down_proj.lora_"), "{w}");
    }
    assert_eq!(adapter.module_count(), 12);
    assert!(adapter.modules().all(|m| !m.name().ends_with("down_proj")));

    // A lenient registration keeps the same warnings; a strict one has none.
    let registry = Registry::new(DType::F32, 1 << 20, None).unwrap();
    registry.register("lenient", &dir, Some(&options)).unwrap();
    registry.register("plain", &src, None).unwrap();
    assert_eq!(registry.warnings("lenient").unwrap(), warnings);
    assert!(registry.warnings("plain").unwrap().is_empty());
    expect_code(registry.warnings("absent"), ErrorCode::NotFound);

    options.set_lenient(false).unwrap();
    expect_code(Adapter::open_with(&dir, &options), ErrorCode::InvalidConfig);
}
