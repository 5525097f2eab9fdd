//! Exporting adapters (byte-identical to what PEFT wrote, dtype and target-version options,
//! errors) and combining them (cat: exactly the weighted sum of deltas; linear of one adapter).

mod common;

use common::{expect_code, fixture, list_files, read_json, TempDir};
use peft_c::{combine_adapters, Adapter, Checkpoint, CombineMethod, DType, ErrorCode, ExportOptions, Module};

#[test]
fn export_reproduces_what_peft_wrote() {
    let manifest = read_json(&fixture(&["adapters", "MANIFEST.json"]));
    let tmp = TempDir::new("export");
    let mut count = 0;
    for (name, m) in manifest.as_object().unwrap() {
        let dir = fixture(&[m["path"].as_str().unwrap()]);
        let adapter = Adapter::open(&dir).unwrap_or_else(|e| panic!("{name}: {e}"));
        let out = tmp.join(name);
        adapter.export(&out, None).unwrap_or_else(|e| panic!("{name}: {e}"));
        for file in ["adapter_model.safetensors", "adapter_config.json"] {
            assert!(std::fs::read(out.join(file)).unwrap() == std::fs::read(dir.join(file)).unwrap(), "{name}: {file}");
        }
        assert_eq!(list_files(&out).len(), 2, "{name}: {:?}", list_files(&out));
        let again = Adapter::open(&out).unwrap();
        assert_eq!((again.config_json(), again.module_count()), (adapter.config_json(), adapter.module_count()));
        count += 1;
    }
    assert!(count >= 20);
}

#[test]
fn export_options() {
    let src = fixture(&["adapters", "llama_lora"]);
    let adapter = Adapter::open(&src).unwrap();
    let tmp = TempDir::new("export-options");
    let out = tmp.path().join("bf16").join("nested");
    let mut options = ExportOptions::new().unwrap();
    options.set_dtype(Some(DType::BF16)).unwrap();
    adapter.export(&out, Some(&options)).unwrap();
    let original = Checkpoint::open(src.join("adapter_model.safetensors")).unwrap();
    let converted = Checkpoint::open(out.join("adapter_model.safetensors")).unwrap();
    for info in original.tensors() {
        let other = converted.tensor_by_name(info.name).unwrap();
        assert_eq!(other.dtype, Some(DType::BF16));
        assert_eq!(converted.view(other.index).unwrap(), original.read(info.index, DType::BF16).unwrap().as_slice());
    }

    // An older PEFT release: fields it does not know are left out, the others kept.
    let mut v013 = ExportOptions::new().unwrap();
    v013.set_peft_version(Some("0.13")).unwrap();
    let old = tmp.join("peft013");
    adapter.export(&old, Some(&v013)).unwrap();
    let full = read_json(&src.join("adapter_config.json"));
    let reduced = read_json(&old.join("adapter_config.json"));
    let (full, reduced) = (full.as_object().unwrap(), reduced.as_object().unwrap());
    assert!(reduced.len() < full.len(), "0.13 config has {} fields, the current {}", reduced.len(), full.len());
    for (key, value) in reduced {
        let before = full.get(key).unwrap_or_else(|| panic!("new field {key}"));
        assert!(before == value || key == "peft_version", "field {key}: {before} -> {value}");
    }
    Adapter::open(&old).unwrap();
    // A field whose value matters and that the release does not know.
    let bias = Adapter::open(fixture(&["adapters", "qwen2_lora_bias"])).unwrap();
    let err = expect_code(bias.export(tmp.join("bias013"), Some(&v013)), ErrorCode::Unsupported);
    assert!(err.message().contains("lora_bias"), "{err}");
    expect_code(ExportOptions::new().unwrap().set_peft_version(Some("0.5")).map(|_| ()), ErrorCode::Unsupported);
    expect_code(
        ExportOptions::new().unwrap().set_peft_version(Some("not a version")).map(|_| ()),
        ErrorCode::InvalidArgument,
    );
    expect_code(ExportOptions::new().unwrap().set_dtype(Some(DType::I8)).map(|_| ()), ErrorCode::InvalidArgument);
    ExportOptions::new().unwrap().set_peft_version(None).unwrap().set_dtype(None).unwrap();
    let file = tmp.join("a_file");
    std::fs::write(&file, b"x").unwrap();
    let err = adapter.export(&file, None).unwrap_err();
    assert!(matches!(err.code(), ErrorCode::InvalidArgument | ErrorCode::Io), "{err}");
    expect_code(adapter.export("", None), ErrorCode::InvalidArgument);
    expect_code(adapter.export("bad\0", None), ErrorCode::InvalidArgument);
    assert!(!tmp.join("bias013").join("adapter_config.json").exists());
}

/// weight * scaling * B @ A in f64 (Linear modules), with its magnitude (see tests/merge.rs).
fn delta(module: Module<'_>, weight: f64) -> (Vec<f64>, Vec<f64>) {
    let a_t = module.tensor_by_role("lora_A.weight").unwrap();
    let b_t = module.tensor_by_role("lora_B.weight").unwrap();
    let (a, b) = (a_t.read_as::<f64>().unwrap(), b_t.read_as::<f64>().unwrap());
    let (r, inp, out) = (a_t.shape()[0] as usize, a_t.shape()[1] as usize, b_t.shape()[0] as usize);
    let s = weight * module.scaling();
    let (mut d, mut m) = (vec![0.0; out * inp], vec![0.0; out * inp]);
    for o in 0..out {
        for i in 0..inp {
            for k in 0..r {
                let p = b[o * r + k] * a[k * inp + i];
                d[o * inp + i] += s * p;
                m[o * inp + i] += (s * p).abs();
            }
        }
    }
    (d, m)
}

/// Every module of `combined` has the weighted sum of the sources' deltas.
fn compare_deltas(combined: &Adapter, sources: &[(&Adapter, f64)]) {
    for module in combined.modules() {
        let (got, _) = delta(module, 1.0);
        let mut want = vec![0.0; got.len()];
        let mut magnitude = vec![0.0; got.len()];
        for (src, weight) in sources {
            let Ok(sm) = src.find_module(module.name()) else { continue };
            let (d, m) = delta(sm, *weight);
            for i in 0..d.len() {
                want[i] += d[i];
                magnitude[i] += m[i];
            }
        }
        for i in 0..got.len() {
            // Factors are rounded to f32 once after scaling: a few ulps of the terms.
            let bound = 16.0 * f64::powi(2.0, -24) * magnitude[i] + 1e-12;
            assert!((got[i] - want[i]).abs() <= bound, "{}[{i}]: {} want {}", module.name(), got[i], want[i]);
        }
    }
}

#[test]
fn combining_adapters() {
    let a1 = Adapter::open(fixture(&["adapters", "llama_lora"])).unwrap();
    let a2 = Adapter::open(fixture(&["adapters", "llama_lora_second"])).unwrap();
    let tmp = TempDir::new("combine");
    combine_adapters(&[&a1, &a2], &[1.0, -0.5], CombineMethod::Cat, tmp.join("cat"), None).unwrap();
    let cat = Adapter::open(tmp.join("cat")).unwrap();
    assert_eq!((cat.r(), cat.module_count()), (a1.r() + a2.r(), a1.module_count()));
    compare_deltas(&cat, &[(&a1, 1.0), (&a2, -0.5)]);

    let mut bf16 = ExportOptions::new().unwrap();
    bf16.set_dtype(Some(DType::BF16)).unwrap();
    combine_adapters(&[&a2], &[2.0], CombineMethod::Linear, tmp.join("linear"), None).unwrap();
    compare_deltas(&Adapter::open(tmp.join("linear")).unwrap(), &[(&a2, 2.0)]);
    combine_adapters(&[&a2], &[2.0], CombineMethod::Linear, tmp.join("linear_bf16"), Some(&bf16)).unwrap();
    let file = Checkpoint::open(tmp.join("linear_bf16").join("adapter_model.safetensors")).unwrap();
    assert!(file.tensors().all(|t| t.dtype == Some(DType::BF16)));

    let dora = Adapter::open(fixture(&["adapters", "llama_dora"])).unwrap();
    expect_code(combine_adapters(&[&dora], &[1.0], CombineMethod::Cat, tmp.join("d"), None), ErrorCode::Unsupported);
    expect_code(combine_adapters(&[], &[], CombineMethod::Cat, tmp.join("e"), None), ErrorCode::InvalidArgument);
    expect_code(
        combine_adapters(&[&a1], &[1.0, 2.0], CombineMethod::Cat, tmp.join("f"), None),
        ErrorCode::InvalidArgument,
    );
    expect_code(
        combine_adapters(&[&a1], &[f64::NAN], CombineMethod::Cat, tmp.join("g"), None),
        ErrorCode::InvalidArgument,
    );
    let rank8 = Adapter::open(fixture(&["adapters", "llama_rank_alpha_pattern"])).unwrap();
    expect_code(
        combine_adapters(&[&a1, &rank8], &[1.0, 1.0], CombineMethod::Linear, tmp.join("j"), None),
        ErrorCode::InvalidArgument,
    );
    for name in ["d", "e", "f", "g", "j"] {
        assert!(!tmp.join(name).join("adapter_config.json").exists(), "a failed combine wrote {name}");
    }
    assert_eq!((CombineMethod::Cat.raw(), CombineMethod::Linear.raw()), (0, 1));
}
