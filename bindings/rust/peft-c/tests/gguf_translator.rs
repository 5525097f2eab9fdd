//! Translators for GGUF names (`Translator::from_gguf`, `Translator::new_gguf`) and
//! `Adapter::export_gguf_split` of the fixture adapter against the fixture base; bad input.

mod common;

use common::{expect_code, fixture, list_files, TempDir};
use peft_c::{Adapter, Checkpoint, ErrorCode, FileFormat, GgmlType, Translator};

fn check_gguf_names(translator: &Translator) {
    assert_eq!(translator.family(), "llama");
    assert_eq!(translator.to_native("model.layers.0.self_attn.q_proj.weight").unwrap(), "blk.0.attn_q.weight");
    assert_eq!(
        translator.to_hf("blk.0.attn_q.weight", true).unwrap(),
        "base_model.model.model.layers.0.self_attn.q_proj.weight"
    );
    // Adapter factor keys are not GGUF tensor names.
    expect_code(translator.to_native("model.layers.0.self_attn.q_proj.lora_A.weight"), ErrorCode::UnresolvedKey);
}

#[test]
fn gguf_translators() {
    // The sample has general.architecture "llama" and no head counts: the names still translate.
    let ckpt = Checkpoint::open(fixture(&["gguf", "bindings_sample.gguf"])).unwrap();
    let from_file = Translator::from_gguf(&ckpt).unwrap();
    drop(ckpt); // the translator copied what it needs
    check_gguf_names(&from_file);
    check_gguf_names(&Translator::new_gguf("llama", 4, 2).unwrap());
}

#[test]
fn gguf_translators_bad_input() {
    expect_code(Translator::new_gguf("llama", 0, 2), ErrorCode::InvalidArgument);
    expect_code(Translator::new_gguf("nosucharch", 4, 2), ErrorCode::Unsupported);
    // A safetensors checkpoint is not a GGUF file.
    let ckpt = Checkpoint::open(fixture(&["models", "llama"])).unwrap();
    expect_code(Translator::from_gguf(&ckpt), ErrorCode::InvalidArgument);
}

#[test]
fn export_gguf_split() {
    let adapter = Adapter::open(fixture(&["adapters", "llama_lora"])).unwrap();
    let base = fixture(&["models", "llama"]);
    let tmp = TempDir::new("export-gguf-split");
    let (out, base_out) = (tmp.join("out.gguf"), tmp.join("base_out"));
    adapter.export_gguf_split(&out, Some(&base), GgmlType::F32, &base_out).unwrap();
    let ckpt = Checkpoint::open(&out).unwrap();
    assert_eq!(ckpt.file_format(0), Some(FileFormat::Gguf));
    assert_eq!(ckpt.len(), 2 * adapter.module_count());
    // Nothing in the plain adapter needs merging: the base is copied as it is.
    assert_eq!(
        std::fs::read(base_out.join("model.safetensors")).unwrap(),
        std::fs::read(base.join("model.safetensors")).unwrap()
    );
}

#[test]
fn export_gguf_split_bad_input() {
    let adapter = Adapter::open(fixture(&["adapters", "llama_lora"])).unwrap();
    let base = fixture(&["models", "llama"]);
    let tmp = TempDir::new("export-gguf-split-bad");
    let out = tmp.join("out.gguf");
    expect_code(adapter.export_gguf_split(&out, Some(&base), GgmlType::F32, &base), ErrorCode::InvalidArgument);
    expect_code(adapter.export_gguf_split(&out, Some(&base), GgmlType::F32, &out), ErrorCode::InvalidArgument);
    expect_code(
        adapter.export_gguf_split(&out, Some(&base), GgmlType(2), tmp.join("base_out")),
        ErrorCode::InvalidArgument,
    );
    assert!(list_files(tmp.path()).is_empty(), "failed split exports left {:?}", list_files(tmp.path()));
    assert!(!tmp.join("base_out").exists());
}
