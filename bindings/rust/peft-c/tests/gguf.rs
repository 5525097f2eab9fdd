//! GGUF files through the binding: file format and version, typed metadata, ggml types, tensors
//! (shape outermost first, F16 converted on read, a Q8_0 tensor readable only as bytes).
//!
//! The file is tests/fixtures/gguf/bindings_sample.gguf (written by bindings_sample.py next to it, in
//! the byte layout of tests/capi/test_gguf.c); the expected values below are the ones that script packs.

mod common;

use common::{expect_code, fixture};
use peft_c::{Checkpoint, DType, ErrorCode, FileFormat, GgmlType, GgufType, GgufValue, OpenOptions};

fn sample_path() -> std::path::PathBuf {
    fixture(&["gguf", "bindings_sample.gguf"])
}

/// The sample opened memory-mapped, with pread and from memory.
fn samples() -> Vec<(&'static str, Checkpoint)> {
    let path = sample_path();
    let mut pread = OpenOptions::new().unwrap();
    pread.set_use_pread(true).unwrap();
    vec![
        ("mmap", Checkpoint::open(&path).unwrap()),
        ("pread", Checkpoint::open_with(&path, &pread).unwrap()),
        ("memory", Checkpoint::from_bytes(&std::fs::read(&path).unwrap()).unwrap()),
    ]
}

#[test]
fn format_version_and_metadata() {
    use GgufValue as V;
    let expected: Vec<(&str, GgufValue)> = vec![
        ("general.architecture", V::String(b"llama")),
        ("general.alignment", V::U32(64)),
        ("a.u8", V::U8(200)),
        ("a.i8", V::I8(-2)),
        ("a.u16", V::U16(0x1234)),
        ("a.i16", V::I16(-1)),
        ("a.i32", V::I32(-7)),
        ("a.f32", V::F32(1.5)),
        ("a.bool", V::Bool(true)),
        ("a.u64", V::U64(u64::MAX)),
        ("a.i64", V::I64(-5)),
        ("a.f64", V::F64(std::f64::consts::PI)),
        ("a.tokens", V::Array(GgufType::String, vec![V::String(b"<s>"), V::String(b""), V::String(b"hello")])),
        ("a.ids", V::Array(GgufType::I32, vec![V::I32(10), V::I32(-20)])),
    ];
    for (mode, ckpt) in samples() {
        assert_eq!(ckpt.file_format(0), Some(FileFormat::Gguf), "{mode}");
        assert_eq!(ckpt.file_format(1), None, "{mode}");
        assert_eq!(ckpt.gguf_version(0), Some(3), "{mode}");
        assert_eq!(ckpt.gguf_metadata(0).unwrap(), expected, "{mode}");
        assert!(ckpt.gguf_metadata(1).unwrap().is_empty(), "{mode}");
        // The safetensors metadata is absent from a GGUF file.
        assert!(!ckpt.has_metadata(0) && ckpt.metadata(0).is_empty(), "{mode}");
    }
}

#[test]
fn value_getters_and_errors() {
    let ckpt = Checkpoint::open(sample_path()).unwrap();
    let get = |key: &str| ckpt.gguf_value(0, key).unwrap_or_else(|e| panic!("{key}: {e}"));
    assert_eq!(get("a.u64").as_u64(), Some(u64::MAX));
    assert_eq!(get("a.u64").as_i64(), None);
    assert_eq!(get("a.i32").as_i64(), Some(-7));
    assert_eq!(get("a.i32").as_u64(), None);
    assert_eq!(get("a.u8").as_i64(), Some(200));
    assert_eq!(get("a.f32").as_f64(), Some(1.5));
    assert_eq!(get("a.f32").as_i64(), None);
    assert_eq!(get("a.bool").as_bool(), Some(true));
    assert_eq!(get("general.architecture").as_str(), Some("llama"));
    assert_eq!(get("a.u8").as_str(), None);
    assert_eq!(get("general.alignment").value_type(), GgufType::U32);
    let tokens = get("a.tokens");
    assert_eq!(tokens.value_type(), GgufType::Array);
    let items = tokens.as_array().unwrap();
    assert_eq!(items.iter().map(|v| v.as_str().unwrap()).collect::<Vec<_>>(), ["<s>", "", "hello"]);
    assert_eq!(get("a.ids").as_array().unwrap().iter().map(|v| v.as_i64().unwrap()).collect::<Vec<_>>(), [10, -20]);

    let e = expect_code(ckpt.gguf_value(0, "no.such.key"), ErrorCode::NotFound);
    assert!(e.message().contains("no.such.key"), "{e}");
    expect_code(ckpt.gguf_value(1, "a.u8"), ErrorCode::InvalidArgument);
    expect_code(ckpt.gguf_value(0, "nul\0key"), ErrorCode::InvalidArgument);
}

#[test]
fn tensors() {
    for (mode, ckpt) in samples() {
        let infos: Vec<_> = ckpt.tensors().collect();
        assert_eq!(infos.iter().map(|t| t.name).collect::<Vec<_>>(), ["w", "q"], "{mode}");
        let (w, q) = (infos[0], infos[1]);
        assert_eq!((w.dtype, w.ggml_type, w.shape), (Some(DType::F16), Some(GgmlType(1)), &[2u64, 3][..]), "{mode}");
        assert_eq!(ckpt.read_as::<f32>(w.index).unwrap(), [1.0, 2.0, 3.0, 4.0, 5.0, 6.0], "{mode}");

        assert_eq!((q.dtype, q.shape, q.data_offsets), (None, &[1u64, 32][..], (64, 98)), "{mode}");
        assert_eq!(q.ggml_type.map(|t| t.to_string()).as_deref(), Some("Q8_0"), "{mode}");
        let (block, size) = q.ggml_type.unwrap().geometry().unwrap();
        assert_eq!(q.nbytes(), q.num_elements() / u64::from(block) * u64::from(size), "{mode}");
        let raw = ckpt.view(q.index).unwrap();
        assert_eq!(raw.len(), 34, "{mode}");
        assert_eq!(&raw[..2], &[0x00, 0x3C], "{mode}: scale 1.0");
        assert_eq!(raw[2..].iter().map(|&b| b as i8).collect::<Vec<_>>(), (-16..16).collect::<Vec<i8>>(), "{mode}");
        let e = expect_code(ckpt.read_as::<f32>(q.index), ErrorCode::Unsupported);
        assert!(e.message().contains("block-quantized"), "{mode}: {e}");
        let e = expect_code(ckpt.view_as::<f32>(q.index), ErrorCode::ShapeMismatch);
        assert!(e.message().contains("Q8_0"), "{mode}: {e}");
    }
}

#[test]
fn safetensors_file_has_no_gguf_side() {
    let ckpt = Checkpoint::open(fixture(&["safetensors", "metadata_one.safetensors"])).unwrap();
    assert_eq!(ckpt.file_format(0), Some(FileFormat::Safetensors));
    assert_eq!(ckpt.gguf_version(0), None);
    assert!(ckpt.gguf_metadata(0).unwrap().is_empty());
    expect_code(ckpt.gguf_value(0, "general.architecture"), ErrorCode::NotFound);
    assert!(!ckpt.is_empty());
    assert!(ckpt.tensors().all(|t| t.ggml_type.is_none() && t.dtype.is_some()));
}

#[test]
fn ggml_types() {
    assert_eq!(GgmlType(12).name(), Some("Q4_K"));
    assert_eq!(GgmlType(4).name(), None); // the removed Q4_2
    assert_eq!(GgmlType(4).to_string(), "GgmlType(4)");
    assert_eq!(GgmlType(-1).name(), None);
    assert_eq!(GgmlType::from_name("BF16"), Some(GgmlType(30)));
    assert_eq!(GgmlType::from_name("bf16"), None);
    assert_eq!("Q8_0".parse::<GgmlType>().unwrap(), GgmlType(8));
    expect_code("q8_0".parse::<GgmlType>(), ErrorCode::InvalidArgument);
    assert_eq!(GgmlType(0).geometry().unwrap(), (1, 4));
    assert_eq!(GgmlType(8).geometry().unwrap(), (32, 34));
    assert_eq!(GgmlType(14).geometry().unwrap(), (256, 210));
    expect_code(GgmlType(31).geometry(), ErrorCode::InvalidArgument);
    assert_eq!(GgufType::from_raw(9), Some(GgufType::Array));
    assert_eq!(GgufType::from_raw(13), None);
    assert_eq!(GgufType::F64.raw(), 12);
}
