//! Whole-model task arithmetic ([`combine_models`]) compared with `peftc model combine` (PEFTC, else
//! the repository's build/peftc) byte for byte, on two "fine-tuned" copies of the llama fixture that
//! the binding's [`Writer`] writes; the base combined with itself; and the refusals, which write nothing.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{expect_code, fixture, TempDir};
use peft_c::{
    combine_models, combine_models_with_progress, merge_checkpoint, Checkpoint, CombineMethod, DType, ErrorCode,
    ExportOptions, MajoritySign, MergeOptions, Writer,
};

/// Runs peftc, or returns false (the comparison is skipped) when there is none.
fn peftc(args: &[std::ffi::OsString]) -> bool {
    let bin = std::env::var_os("PEFTC")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../build/peftc"));
    if !bin.exists() {
        eprintln!("no peftc at {} (set PEFTC): comparison skipped", bin.display());
        return false;
    }
    let out = Command::new(&bin).args(args).output().unwrap();
    assert!(out.status.success(), "peftc failed: {}", String::from_utf8_lossy(&out.stderr));
    true
}

/// Writes a copy of the llama fixture to `dir` with every F32 tensor moved by small deterministic
/// noise (`phase` chooses it); config.json is copied.
fn fine_tune(dir: &Path, phase: f64) {
    let base = fixture(&["models", "llama"]);
    std::fs::create_dir_all(dir).unwrap();
    std::fs::copy(base.join("config.json"), dir.join("config.json")).unwrap();
    let checkpoint = Checkpoint::open(base.join("model.safetensors")).unwrap();
    let mut writer = Writer::new(dir.join("model.safetensors")).unwrap();
    let mut data = Vec::new();
    for (t, info) in checkpoint.tensors().enumerate() {
        let dtype = info.dtype.unwrap();
        writer.add_tensor(info.name, dtype, info.shape).unwrap();
        let mut bytes = checkpoint.read(info.index, dtype).unwrap();
        if dtype == DType::F32 {
            for (j, chunk) in bytes.chunks_exact_mut(4).enumerate() {
                let v = f32::from_le_bytes(chunk.try_into().unwrap());
                let noise = 0.02 * (phase + t as f64 * 1.7 + j as f64 * 0.61).sin();
                chunk.copy_from_slice(&(v + noise as f32).to_le_bytes());
            }
        }
        data.push((info.name.to_string(), dtype, bytes));
    }
    writer.set_metadata_present(true).unwrap();
    writer.set_metadata("format", "pt").unwrap();
    writer.start().unwrap();
    for name in writer.order() {
        let (_, dtype, bytes) = data.iter().find(|(n, _, _)| *n == name).unwrap();
        writer.write_tensor(&name, *dtype, bytes).unwrap();
    }
    writer.finish().unwrap();
}

fn read(path: PathBuf) -> Vec<u8> {
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn dare_ties_of_two_fine_tuned_models_matches_peftc() {
    let dir = TempDir::new("modelcomb");
    let base = fixture(&["models", "llama"]);
    let (a, b) = (dir.join("a"), dir.join("b"));
    fine_tune(&a, 0.3);
    fine_tune(&b, 2.1);
    let mut combine = ExportOptions::new().unwrap();
    combine.set_combine_density(0.5).unwrap().set_combine_seed(5).unwrap();
    combine.set_combine_majority_sign(MajoritySign::Frequency).unwrap();
    let out = dir.join("dare_ties");
    let result =
        combine_models(&base, &[(&a, 0.7), (&b, -0.4)], CombineMethod::DareTies, &out, Some(&combine), None).unwrap();
    assert!(result.merged() > 0, "{result:?}");
    assert!(result.files().contains(&"model.safetensors"), "{result:?}");
    let model = read(out.join("model.safetensors"));
    assert_ne!(model, read(base.join("model.safetensors")), "the combination is the base");

    let reference = dir.join("dare_ties-peftc");
    let mut args: Vec<std::ffi::OsString> = ["model", "combine", "--base"].map(Into::into).to_vec();
    args.push(base.clone().into());
    for (input, weight) in [(&a, "0.7"), (&b, "-0.4")] {
        args.extend(["--model".into(), format!("{}:{weight}", input.display()).into()]);
    }
    args.extend(
        ["--method", "dare_ties", "--density", "0.5", "--seed", "5", "--majority-sign", "frequency", "--out"]
            .map(Into::into),
    );
    args.push(reference.clone().into());
    if peftc(&args) {
        assert!(model == read(reference.join("model.safetensors")), "model.safetensors differs from peftc's");
    }

    // The same through the progress variant, whose last call has done == total.
    let mut options = MergeOptions::new().unwrap();
    let mut last = (0, 1);
    let again = dir.join("again");
    combine_models_with_progress(
        &base,
        &[(&a, 0.7), (&b, -0.4)],
        CombineMethod::DareTies,
        &again,
        Some(&combine),
        &mut options,
        |done, total| {
            last = (done, total);
            std::ops::ControlFlow::Continue(())
        },
    )
    .unwrap();
    assert_eq!(last.0, last.1);
    assert!(model == read(again.join("model.safetensors")));
}

#[test]
fn the_base_with_itself_is_the_base() {
    let dir = TempDir::new("modelself");
    let base = fixture(&["models", "llama"]);
    let out = dir.join("same");
    let result = combine_models(&base, &[(&base, 0.5), (&base, 1.5)], CombineMethod::Linear, &out, None, None).unwrap();
    assert!(result.merged() > 0, "{result:?}");
    assert!(read(out.join("model.safetensors")) == read(base.join("model.safetensors")));
}

#[test]
fn refused_combinations_write_nothing() {
    let dir = TempDir::new("modelbad");
    let base = fixture(&["models", "llama"]);
    let models = [(&base, 0.7), (&base, -0.4)];
    let mut density = ExportOptions::new().unwrap();
    density.set_combine_density(0.5).unwrap();
    let mut with_adapter = MergeOptions::new().unwrap();
    with_adapter.add_adapter_dir(fixture(&["adapters", "llama_lora"]), 1.0).unwrap();
    let cases: [(&str, CombineMethod, Option<&ExportOptions>, Option<&MergeOptions>); 4] = [
        ("ties-without-density", CombineMethod::Ties, None, None),
        ("svd", CombineMethod::Svd, Some(&density), None),
        ("with-adapter", CombineMethod::Linear, None, Some(&with_adapter)),
        ("none", CombineMethod::Linear, None, None),
    ];
    for (name, method, combine, options) in cases {
        let out = dir.join(name);
        let inputs: &[(&PathBuf, f64)] = if name == "none" { &[] } else { &models };
        expect_code(combine_models(&base, inputs, method, &out, combine, options), ErrorCode::InvalidArgument);
        assert!(!out.exists(), "{name}: a refused combination wrote {}", out.display());
    }
}

/// The llama fixture's merge options with llama_lora (0.9) and llama_rslora (-0.6).
fn two_adapters() -> (MergeOptions, PathBuf, PathBuf) {
    let (lora, rslora) = (fixture(&["adapters", "llama_lora"]), fixture(&["adapters", "llama_rslora"]));
    let mut options = MergeOptions::new().unwrap();
    options.add_adapter_dir(&lora, 0.9).unwrap().add_adapter_dir(&rslora, -0.6).unwrap();
    (options, lora, rslora)
}

#[test]
fn merge_combined_by_ties_matches_peftc() {
    let dir = TempDir::new("mergecomb");
    let base = fixture(&["models", "llama"]);
    let (mut options, lora, rslora) = two_adapters();
    let mut density = ExportOptions::new().unwrap();
    density.set_combine_density(0.5).unwrap();
    options.set_combine(CombineMethod::Ties, Some(&density)).unwrap();
    let out = dir.join("ties");
    let result = merge_checkpoint(&base, &out, &options).unwrap();
    assert!(result.merged() > 0, "{result:?}");
    let model = read(out.join("model.safetensors"));

    let reference = dir.join("ties-peftc");
    let mut args: Vec<std::ffi::OsString> = ["merge", "--base"].map(Into::into).to_vec();
    args.push(base.clone().into());
    args.push("--out".into());
    args.push(reference.clone().into());
    for (adapter, weight) in [(&lora, "0.9"), (&rslora, "-0.6")] {
        args.extend(["--adapter".into(), format!("{}:{weight}", adapter.display()).into()]);
    }
    args.extend(["--combine", "ties", "--density", "0.5"].map(Into::into));
    if peftc(&args) {
        assert!(model == read(reference.join("model.safetensors")), "model.safetensors differs from peftc's");
    }

    // Linear is the plain merge, which the ties merge is not.
    let (plain_options, _, _) = two_adapters();
    merge_checkpoint(&base, dir.join("plain"), &plain_options).unwrap();
    let plain = read(dir.join("plain").join("model.safetensors"));
    assert!(model != plain, "the ties merge is the plain merge");
    options.set_combine(CombineMethod::Linear, None).unwrap();
    merge_checkpoint(&base, dir.join("linear"), &options).unwrap();
    assert!(read(dir.join("linear").join("model.safetensors")) == plain, "linear is not the plain merge");
}

#[test]
fn refused_merge_combinations() {
    let mut options = MergeOptions::new().unwrap();
    let mut seed = ExportOptions::new().unwrap();
    seed.set_combine_seed(3).unwrap();
    let mut density = ExportOptions::new().unwrap();
    density.set_combine_density(0.5).unwrap();
    for (method, combine) in [
        (CombineMethod::Ties, None),
        (CombineMethod::DareTies, Some(&seed)),
        (CombineMethod::MagnitudePrune, Some(&seed)),
        (CombineMethod::Svd, Some(&density)),
        (CombineMethod::Cat, None),
    ] {
        expect_code(options.set_combine(method, combine).map(|_| ()), ErrorCode::InvalidArgument);
    }
    // A refused setting leaves the options usable.
    options.set_combine(CombineMethod::DareLinear, Some(&density)).unwrap();
}
