//! Reading: every valid fixture as the reference package sees it (names, dtypes, shapes, offsets,
//! metadata, the bytes' SHA-256, the values as torch's `.double()` gives them), in every reading
//! mode; folders of shards; views; lookup and argument errors.

mod common;

use std::path::Path;

use common::{expect_code, fixture, read_json, sha256_hex, TempDir};
use peft_c::{Checkpoint, DType, ErrorCode, OpenOptions};
use serde_json::Value;

fn file_cases() -> Vec<String> {
    let index = read_json(&fixture(&["safetensors", "INDEX.json"]));
    let cases: Vec<String> = index.as_object().unwrap().keys().filter(|k| !k.ends_with('/')).cloned().collect();
    assert!(cases.len() >= 40, "only {} cases", cases.len());
    cases
}

/// The three ways of opening one file.
fn open_all_ways(path: &Path) -> Vec<(&'static str, Checkpoint)> {
    let mut pread = OpenOptions::new().unwrap();
    pread.set_use_pread(true).unwrap();
    let bytes = std::fs::read(path).unwrap();
    vec![
        ("mmap", Checkpoint::open(path).unwrap()),
        ("pread", Checkpoint::open_with(path, &pread).unwrap()),
        ("memory", Checkpoint::from_bytes(&bytes).unwrap()),
    ]
}

fn expected_f64(value: &Value) -> f64 {
    match value {
        Value::String(s) if s == "nan" => f64::NAN,
        Value::String(s) if s == "inf" => f64::INFINITY,
        Value::String(s) if s == "-inf" => f64::NEG_INFINITY,
        other => other.as_f64().unwrap(),
    }
}

/// Dtypes that peft_convert is documented to turn into F64.
fn converts_to_f64(dtype: DType) -> bool {
    !matches!(
        dtype,
        DType::F4 | DType::F6E2M3 | DType::F6E3M2 | DType::F8E8M0 | DType::F8E4M3Fnuz | DType::F8E5M2Fnuz | DType::C64
    )
}

/// Compares the tensors of file `file` of `ckpt` with a fixture description.
fn check_file(what: &str, ckpt: &Checkpoint, file: usize, want: &Value) {
    let tensors = want["tensors"].as_array().unwrap();
    let in_file: Vec<_> = ckpt.tensors().filter(|t| t.file == file).collect();
    assert_eq!(in_file.len(), tensors.len(), "{what}: tensor count");
    // Tensors of a file are numbered in data order.
    assert!(in_file.windows(2).all(|w| w[0].data_offsets.0 <= w[1].data_offsets.0), "{what}: order");
    for t in tensors {
        let name = t["name"].as_str().unwrap();
        let info = ckpt.tensor_by_name(name).unwrap_or_else(|e| panic!("{what}: {name:?}: {e}"));
        assert_eq!(info.file, file, "{what}: {name:?} file");
        assert_eq!(info.name, name);
        assert_eq!(info.dtype.unwrap().name(), t["dtype"].as_str().unwrap(), "{what}: {name:?} dtype");
        let shape: Vec<u64> = t["shape"].as_array().unwrap().iter().map(|d| d.as_u64().unwrap()).collect();
        assert_eq!(info.shape, shape.as_slice(), "{what}: {name:?} shape");
        let offsets = t["data_offsets"].as_array().unwrap();
        assert_eq!(info.data_offsets, (offsets[0].as_u64().unwrap(), offsets[1].as_u64().unwrap()));
        let view = ckpt.view(info.index).unwrap();
        assert_eq!(view.len() as u64, info.nbytes(), "{what}: {name:?} view length");
        assert_eq!(sha256_hex(view), t["sha256"].as_str().unwrap(), "{what}: {name:?} bytes");

        let Some(values) = t.get("f64").and_then(Value::as_array) else { continue };
        // The header promises F64 from these dtypes; others may convert too, or be UNSUPPORTED.
        let got = match ckpt.read_as::<f64>(info.index) {
            Ok(got) => got,
            Err(e) if !converts_to_f64(info.dtype.unwrap()) && e.code() == ErrorCode::Unsupported => continue,
            Err(e) => panic!("{what}: {name:?} as F64: {e}"),
        };
        assert_eq!(got.len(), values.len(), "{what}: {name:?} element count");
        for (i, (g, w)) in got.iter().zip(values).enumerate() {
            let w = expected_f64(w);
            assert!(*g == w || (g.is_nan() && w.is_nan()), "{what}: {name:?}[{i}] = {g}, reference {w}");
        }
        if info.dtype == Some(DType::F32) {
            // Hand-made headers may leave a tensor unaligned; the typed view must then refuse it.
            if view.as_ptr() as usize % 4 == 0 || view.is_empty() {
                let typed = ckpt.view_as::<f32>(info.index).unwrap();
                assert!(typed.iter().zip(&got).all(|(a, b)| f64::from(*a) == *b || a.is_nan()), "{what}: typed view");
            } else {
                expect_code(ckpt.view_as::<f32>(info.index), ErrorCode::InvalidArgument);
            }
        }
    }
}

fn check_metadata(what: &str, ckpt: &Checkpoint, file: usize, want: &Value, null_is_absent: bool) {
    let got = ckpt.metadata(file);
    match want {
        Value::Object(map) => {
            assert!(ckpt.has_metadata(file), "{what}: has_metadata");
            let mut expected: Vec<(&str, &str)> = map.iter().map(|(k, v)| (k.as_str(), v.as_str().unwrap())).collect();
            expected.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
            assert_eq!(got, expected, "{what}: metadata");
            for (k, v) in expected {
                assert_eq!(ckpt.metadata_value(file, k), Some(v));
            }
        }
        _ => {
            assert!(got.is_empty(), "{what}: metadata {got:?}");
            if null_is_absent {
                assert!(!ckpt.has_metadata(file), "{what}: has_metadata");
            }
        }
    }
}

#[test]
fn files_match_the_reference_in_every_mode() {
    for case in file_cases() {
        let path = fixture(&["safetensors", &format!("{case}.safetensors")]);
        let want = read_json(&fixture(&["safetensors", &format!("{case}.json")]));
        for (mode, ckpt) in open_all_ways(&path) {
            let what = format!("{case} ({mode})");
            assert_eq!(ckpt.file_count(), 1);
            assert_eq!(ckpt.len(), want["tensors"].as_array().unwrap().len(), "{what}");
            assert_eq!(ckpt.is_empty(), want["tensors"].as_array().unwrap().is_empty());
            check_file(&what, &ckpt, 0, &want);
            check_metadata(&what, &ckpt, 0, &want["metadata"], case != "metadata_null");
            assert_eq!(ckpt.index_metadata_json(), None);
            if mode != "memory" {
                assert_eq!(ckpt.file_path(0), Some(path.as_path()));
            }
            assert_eq!(ckpt.file_path(1), None);
        }
    }
}

#[test]
fn folders_match_the_reference() {
    for folder in ["sharded", "sharded_hub", "single"] {
        let dir = fixture(&["safetensors", folder]);
        let want = read_json(&fixture(&["safetensors", &format!("{folder}.json")]));
        let files = want["files"].as_object().unwrap();
        let mut pread = OpenOptions::new().unwrap();
        pread.set_use_pread(true).unwrap();
        for (mode, ckpt) in
            [("mmap", Checkpoint::open(&dir).unwrap()), ("pread", Checkpoint::open_with(&dir, &pread).unwrap())]
        {
            let what = format!("{folder}/ ({mode})");
            assert_eq!(ckpt.file_count(), files.len(), "{what}");
            let total: usize = files.values().map(|f| f["tensors"].as_array().unwrap().len()).sum();
            assert_eq!(ckpt.len(), total, "{what}");
            for file in 0..ckpt.file_count() {
                let path = ckpt.file_path(file).unwrap();
                assert_eq!(path.parent().unwrap(), dir.as_path(), "{what}");
                let name = path.file_name().unwrap().to_str().unwrap();
                let desc = &files[name];
                check_file(&format!("{what} {name}"), &ckpt, file, desc);
                check_metadata(&what, &ckpt, file, &desc["metadata"], true);
            }
            let index_metadata = want["index"].get("metadata").cloned().unwrap_or(Value::Null);
            match ckpt.index_metadata_json() {
                Some(json) => assert_eq!(serde_json::from_str::<Value>(json).unwrap(), index_metadata, "{what}"),
                None => assert!(index_metadata.is_null(), "{what}: no index metadata"),
            }
        }
    }
}

#[test]
fn from_bytes_copies_the_input() {
    let path = fixture(&["safetensors", "dtype_f32.safetensors"]);
    let mut bytes = std::fs::read(&path).unwrap();
    let ckpt = Checkpoint::from_bytes(&bytes).unwrap();
    let before = ckpt.view(1).unwrap().to_vec();
    bytes.iter_mut().for_each(|b| *b = 0xAB);
    drop(bytes);
    assert_eq!(ckpt.view(1).unwrap(), before.as_slice());
}

#[test]
fn header_cap_is_an_option() {
    let path = fixture(&["safetensors", "dtype_f32.safetensors"]);
    let mut small = OpenOptions::new().unwrap();
    small.set_max_header_size(16).unwrap();
    expect_code(Checkpoint::open_with(&path, &small), ErrorCode::HeaderTooLarge);
    expect_code(Checkpoint::from_bytes_with(&std::fs::read(&path).unwrap(), &small), ErrorCode::HeaderTooLarge);
    small.set_max_header_size(1 << 20).unwrap().set_use_pread(false).unwrap();
    Checkpoint::open_with(&path, &small).unwrap();
}

#[test]
fn open_errors() {
    let tmp = TempDir::new("open-errors");
    expect_code(Checkpoint::open(tmp.join("absent.safetensors")), ErrorCode::Io);
    expect_code(Checkpoint::open("bad\0path"), ErrorCode::InvalidArgument);
    // A folder with neither an index nor model.safetensors.
    let err = Checkpoint::open(tmp.path()).unwrap_err();
    assert!(matches!(err.code(), ErrorCode::InvalidCheckpoint | ErrorCode::NotFound | ErrorCode::Io), "{err}");
    // An index naming a file outside the folder.
    let dir = tmp.join("escape");
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(dir.join("model.safetensors.index.json"), r#"{"weight_map": {"w": "../x.safetensors"}}"#).unwrap();
    expect_code(Checkpoint::open(&dir), ErrorCode::InvalidCheckpoint);
    expect_code(Checkpoint::from_bytes(&[]), ErrorCode::HeaderTooSmall);
}

#[test]
fn lookup_and_argument_errors() {
    let ckpt = Checkpoint::open(fixture(&["safetensors", "dtype_f32.safetensors"])).unwrap();
    let n = ckpt.len();
    let err = expect_code(ckpt.find("no_such_tensor"), ErrorCode::NotFound);
    assert!(err.message().contains("no_such_tensor"), "{err}");
    expect_code(ckpt.tensor_by_name("no_such_tensor"), ErrorCode::NotFound);
    assert!(ckpt.tensor(n).is_none());
    expect_code(ckpt.view(n), ErrorCode::InvalidArgument);
    expect_code(ckpt.read(n, DType::F32), ErrorCode::InvalidArgument);
    expect_code(ckpt.read_into(n, DType::F32, &mut [0u8; 4]), ErrorCode::InvalidArgument);
    let values = ckpt.find("values").unwrap();
    expect_code(ckpt.read_into(values, DType::F32, &mut [0u8; 4]), ErrorCode::InvalidArgument);
    expect_code(ckpt.read(values, DType::I32), ErrorCode::Unsupported);
    expect_code(ckpt.view_as::<f64>(values), ErrorCode::ShapeMismatch);
    expect_code(ckpt.view_as::<f32>(n), ErrorCode::InvalidArgument);
    assert!(ckpt.metadata(5).is_empty() && !ckpt.has_metadata(5));
    // Converting reads: F32 -> BF16 -> F32 agrees with peft_c::convert.
    let bf16 = ckpt.read(values, DType::BF16).unwrap();
    let mut expected = vec![0u8; bf16.len()];
    peft_c::convert(DType::F32, ckpt.view(values).unwrap(), DType::BF16, &mut expected).unwrap();
    assert_eq!(bf16, expected);
}

#[test]
fn zero_size_tensors_give_empty_views() {
    let ckpt = Checkpoint::open(fixture(&["safetensors", "zero_size.safetensors"])).unwrap();
    let mut saw_empty = false;
    for t in ckpt.tensors() {
        if t.num_elements() == 0 {
            saw_empty = true;
            assert!(ckpt.view(t.index).unwrap().is_empty());
            assert!(ckpt.read(t.index, t.dtype.unwrap()).unwrap().is_empty());
        }
    }
    assert!(saw_empty);
}

/// A hand-made file whose F32 tensor starts one byte into the data: the typed view refuses it,
/// reading works.
#[test]
fn misaligned_typed_view_is_refused() {
    let header =
        r#"{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"b":{"dtype":"F32","shape":[2],"data_offsets":[1,9]}}"#;
    let mut header = header.to_string();
    while (8 + header.len()) % 8 != 0 {
        header.push(' ');
    }
    let mut file = (header.len() as u64).to_le_bytes().to_vec();
    file.extend_from_slice(header.as_bytes());
    file.push(7);
    file.extend_from_slice(&1.5f32.to_le_bytes());
    file.extend_from_slice(&(-2.0f32).to_le_bytes());
    let ckpt = Checkpoint::from_bytes(&file).unwrap();
    let b = ckpt.find("b").unwrap();
    if ckpt.view(b).unwrap().as_ptr() as usize % 4 != 0 {
        expect_code(ckpt.view_as::<f32>(b), ErrorCode::InvalidArgument);
    }
    assert_eq!(ckpt.read_as::<f32>(b).unwrap(), [1.5, -2.0]);
    assert_eq!(ckpt.view_as::<u8>(ckpt.find("a").unwrap()).unwrap(), [7]);
}

/// Names holding NUL bytes (legal in safetensors) are found and reported whole.
#[test]
fn names_with_nul_bytes() {
    let ckpt = Checkpoint::open(fixture(&["safetensors", "escaped_names.safetensors"])).unwrap();
    let name = "ctl\u{0}\u{1}\u{1f}";
    let info = ckpt.tensor_by_name(name).unwrap();
    assert_eq!(info.name, name);
    expect_code(ckpt.find("ctl"), ErrorCode::NotFound);
}
