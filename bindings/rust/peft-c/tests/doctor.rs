//! The adapter doctor: a clean fixture adapter, a config that does not fit its tensors (a problem,
//! not an error), --fix of a clean adapter byte for byte, and errors.

mod common;

use common::{expect_code, fixture, TempDir};
use peft_c::{adapter_doctor, adapter_doctor_fix, ErrorCode};
use serde_json::Value;

fn kinds(report: &Value) -> Vec<String> {
    report["problems"].as_array().unwrap().iter().map(|p| p["kind"].as_str().unwrap().to_string()).collect()
}

#[test]
fn clean_adapter_and_fix() {
    let adapter = fixture(&["adapters", "llama_lora"]);
    let base = fixture(&["models", "llama"]);
    let report: Value = serde_json::from_str(&adapter_doctor(&adapter, Some(&base)).unwrap()).unwrap();
    assert_eq!(report["summary"]["ok"], Value::Bool(true));
    assert_eq!(report["summary"]["matched_modules"], 14);
    let tmp = TempDir::new("doctor");
    let out = tmp.join("fixed");
    let same: Value = serde_json::from_str(&adapter_doctor_fix(&adapter, Some(&base), &out).unwrap()).unwrap();
    assert_eq!(same, report);
    for file in ["adapter_model.safetensors", "adapter_config.json"] {
        assert!(std::fs::read(out.join(file)).unwrap() == std::fs::read(adapter.join(file)).unwrap(), "{file}");
    }
}

#[test]
fn rank_mismatch_is_a_problem() {
    let adapter = fixture(&["adapters", "llama_lora"]);
    let tmp = TempDir::new("doctor-rank");
    let dir = tmp.join("rank");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(adapter.join("adapter_model.safetensors"), dir.join("adapter_model.safetensors")).unwrap();
    let config =
        std::fs::read_to_string(adapter.join("adapter_config.json")).unwrap().replace("\"r\": 4,", "\"r\": 2,");
    std::fs::write(dir.join("adapter_config.json"), config).unwrap();
    let report: Value = serde_json::from_str(&adapter_doctor(&dir, None).unwrap()).unwrap();
    assert_eq!(report["summary"]["ok"], Value::Bool(false));
    assert!(kinds(&report).iter().all(|k| k == "rank_mismatch"), "{:?}", kinds(&report));
    assert_eq!(kinds(&report).len(), 14);
}

#[test]
fn errors() {
    let tmp = TempDir::new("doctor-errors");
    expect_code(adapter_doctor(&tmp.join("absent"), None), ErrorCode::NotFound);
    expect_code(adapter_doctor_fix(&tmp.join("absent"), None, &tmp.join("out")), ErrorCode::NotFound);
    assert!(!tmp.join("out").exists());
}
