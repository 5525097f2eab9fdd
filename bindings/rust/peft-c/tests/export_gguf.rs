//! GGUF LoRA adapters through the binding: the fixture adapter exported against the fixture base
//! (tests/fixtures/models/llama), read back as a GGUF checkpoint (a .lora_a/.lora_b pair per module,
//! adapter.lora.alpha), imported back to a PEFT adapter folder with the same modules; bad input.

mod common;

use std::collections::BTreeSet;
use std::path::Path;

use common::{expect_code, fixture, TempDir};
use peft_c::{import_adapter_gguf, Adapter, Checkpoint, ErrorCode, FileFormat, GgmlType, GgufValue};

fn module_names(adapter: &Adapter) -> BTreeSet<String> {
    adapter.modules().map(|m| m.name().to_owned()).collect()
}

/// The values of a module's factor, as f32.
fn factor(adapter: &Adapter, module: &str, role: &str) -> Vec<f32> {
    let m = adapter.find_module(module).unwrap();
    m.tensor_by_role(role).unwrap_or_else(|| panic!("{module} has no {role}")).read_as::<f32>().unwrap()
}

#[test]
fn export_gguf_round_trip() {
    let adapter = Adapter::open(fixture(&["adapters", "llama_lora"])).unwrap();
    let base = fixture(&["models", "llama"]);
    let tmp = TempDir::new("export-gguf");
    for ggml_type in [GgmlType::F32, GgmlType::F16, GgmlType::BF16] {
        let out = tmp.join(&format!("{ggml_type}.gguf"));
        adapter.export_gguf(&out, Some(&base), ggml_type).unwrap_or_else(|e| panic!("{ggml_type}: {e}"));
        let ckpt = Checkpoint::open(&out).unwrap();
        assert_eq!(ckpt.file_format(0), Some(FileFormat::Gguf));
        for (key, want) in [("general.architecture", "llama"), ("general.type", "adapter"), ("adapter.type", "lora")] {
            assert_eq!(ckpt.gguf_value(0, key).unwrap().as_str(), Some(want), "{key}");
        }
        match ckpt.gguf_value(0, "adapter.lora.alpha").unwrap() {
            GgufValue::F32(alpha) => assert_eq!(f64::from(alpha), adapter.lora_alpha()),
            other => panic!("adapter.lora.alpha is {other:?}"),
        }
        assert_eq!(ckpt.len(), 2 * adapter.module_count());
        let mut stems = BTreeSet::new();
        for info in ckpt.tensors() {
            let stem = info.name.strip_suffix(".weight.lora_a").or_else(|| info.name.strip_suffix(".weight.lora_b"));
            let stem = stem.unwrap_or_else(|| panic!("{} is not a GGUF LoRA factor", info.name));
            assert!(stem.starts_with("blk."), "{}", info.name);
            assert_eq!(info.ggml_type, Some(ggml_type), "{}", info.name);
            stems.insert(stem.to_owned());
        }
        assert_eq!(stems.len(), adapter.module_count());
        let q = ckpt.tensor_by_name("blk.0.attn_q.weight.lora_a").unwrap();
        assert_eq!(q.shape, [u64::try_from(adapter.r()).unwrap(), 16]);

        let back = tmp.path().join(format!("{ggml_type}-peft")).join("nested");
        import_adapter_gguf(&out, &back, &base).unwrap_or_else(|e| panic!("{ggml_type}: {e}"));
        let imported = Adapter::open(&back).unwrap();
        assert_eq!(imported.module_count(), adapter.module_count());
        assert_eq!(module_names(&imported), module_names(&adapter));
        assert_eq!((imported.r(), imported.lora_alpha()), (adapter.r(), adapter.lora_alpha()));
        assert_eq!(imported.base_model_name_or_path().map(Path::new), Some(base.as_path()));
        if ggml_type == GgmlType::F32 {
            // F32 factors come back exactly, the LLaMA row order of q/k undone.
            for m in adapter.modules() {
                for role in ["lora_A.weight", "lora_B.weight"] {
                    assert_eq!(
                        factor(&imported, m.name(), role),
                        factor(&adapter, m.name(), role),
                        "{} {role}",
                        m.name()
                    );
                }
            }
        }
    }
}

#[test]
fn export_gguf_bad_input() {
    let adapter = Adapter::open(fixture(&["adapters", "llama_lora"])).unwrap();
    let base = fixture(&["models", "llama"]);
    let tmp = TempDir::new("export-gguf-bad");
    let out = tmp.join("out.gguf");
    // A base folder without config.json has no architecture.
    let empty = tmp.join("empty_base");
    std::fs::create_dir(&empty).unwrap();
    expect_code(adapter.export_gguf(&out, Some(&empty), GgmlType::F32), ErrorCode::InvalidConfig);
    // A type other than F32, F16, BF16 and Q8_0.
    expect_code(adapter.export_gguf(&out, Some(&base), GgmlType(2)), ErrorCode::InvalidArgument);
    expect_code(adapter.export_gguf(&out, Some(&base), GgmlType(-1)), ErrorCode::InvalidArgument);
    assert!(!out.exists());

    adapter.export_gguf(&out, Some(&base), GgmlType::F32).unwrap();
    let back = tmp.join("peft");
    // The base is required.
    expect_code(import_adapter_gguf(&out, &back, ""), ErrorCode::InvalidArgument);
    // A GGUF file that is not an adapter.
    expect_code(
        import_adapter_gguf(fixture(&["gguf", "bindings_sample.gguf"]), &back, &base),
        ErrorCode::InvalidArgument,
    );
    expect_code(import_adapter_gguf(tmp.join("absent.gguf"), &back, &base), ErrorCode::Io);
    assert!(!back.exists());
}
