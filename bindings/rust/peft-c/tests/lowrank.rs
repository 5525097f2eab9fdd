//! The recent C API through the safe crate, compared with `peftc` (PEFTC, else the repository's
//! build/peftc) byte for byte: LoRA extraction and conversion ([`extract_lora`], [`convert_to_lora`],
//! [`convert_initial`]), a merge into a block-quantized GGUF base with an output type and the store
//! report, and DoRA in unmerged apply with the host's base weight ([`Registry::set_base_weight`]);
//! the pruning combinations ([`combine_adapters`] with ties and dare_linear), the SVD combinations
//! (svd, ties_svd, dare_ties_svd), the combination in delta space ([`combine_deltas`]) and the ggml
//! merge arithmetic ([`MergeOptions::set_arithmetic`]).

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{expect_code, fixture, TempDir};
use peft_c::{
    combine_adapters, combine_deltas, convert_initial, convert_to_lora, extract_lora, lora_apply, merge_checkpoint,
    Adapter, Arithmetic, Buffer, BufferRef, Checkpoint, CombineMethod, DType, ErrorCode, ExportOptions, GgmlType,
    LowRankOptions, MajoritySign, MergeOptions, Registry, SvdMethod,
};
use serde_json::Value;

/// Runs peftc, or returns false (the comparison is skipped) when there is none.
fn peftc(args: &[&dyn AsRef<std::ffi::OsStr>]) -> bool {
    let bin = std::env::var_os("PEFTC")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../build/peftc"));
    if !bin.exists() {
        eprintln!("no peftc at {} (set PEFTC): comparison skipped", bin.display());
        return false;
    }
    let out = Command::new(&bin).args(args.iter().map(|a| a.as_ref())).output().unwrap();
    assert!(out.status.success(), "peftc failed: {}", String::from_utf8_lossy(&out.stderr));
    true
}

fn assert_same_files(a: &Path, b: &Path, names: &[&str]) {
    for name in names {
        let (x, y) = (std::fs::read(a.join(name)).unwrap(), std::fs::read(b.join(name)).unwrap());
        assert!(!x.is_empty() && x == y, "{name} differs between {} and {}", a.display(), b.display());
    }
}

const ADAPTER_FILES: [&str; 2] = ["adapter_model.safetensors", "adapter_config.json"];

fn rank_options(rank: i64) -> LowRankOptions {
    let mut o = LowRankOptions::new().unwrap();
    o.set_rank(rank).unwrap();
    o
}

#[test]
fn extraction_and_conversion_write_what_peftc_writes() {
    let dir = TempDir::new("lowrank");
    let base = fixture(&["models", "llama"]);
    let lora_dir = fixture(&["adapters", "llama_lora"]);
    let tuned = dir.join("tuned");
    let mut merge = MergeOptions::new().unwrap();
    merge.add_adapter_dir(&lora_dir, 1.0).unwrap();
    merge_checkpoint(&base, &tuned, &merge).unwrap();

    let mut opts = rank_options(2);
    opts.set_threads(2).unwrap().set_modules(&["q_proj", "v_proj"]).unwrap();
    let report = extract_lora(&base, &tuned, dir.join("extracted"), &opts).unwrap();
    assert!(!report.is_empty());
    for m in &report {
        assert!(m.rank == 2 && (0.0..1.0).contains(&m.error), "{m:?}");
        assert!(m.name.ends_with(".q_proj") || m.name.ends_with(".v_proj"), "{m:?}");
    }
    let reference = dir.join("extracted-peftc");
    let (b, t) = (base.as_os_str(), tuned.as_os_str());
    let r = reference.as_os_str();
    if peftc(&[
        &"adapter",
        &"extract",
        &"--base",
        &b,
        &"--tuned",
        &t,
        &"--out",
        &r,
        &"--rank",
        &"2",
        &"--threads",
        &"2",
        &"--modules",
        &"q_proj,v_proj",
    ]) {
        assert_same_files(&dir.join("extracted"), &reference, &ADAPTER_FILES);
    }

    let mut energy = LowRankOptions::new().unwrap();
    energy.set_energy(0.9).unwrap().set_dtype(Some(DType::BF16)).unwrap().set_svd(SvdMethod::Randomized).unwrap();
    let report = extract_lora(&base, &tuned, dir.join("energy"), &energy).unwrap();
    assert!(report.iter().all(|m| m.rank >= 1), "{report:?}");
    let reference = dir.join("energy-peftc");
    let r = reference.as_os_str();
    if peftc(&[
        &"adapter",
        &"extract",
        &"--base",
        &b,
        &"--tuned",
        &t,
        &"--out",
        &r,
        &"--energy",
        &"0.9",
        &"--dtype",
        &"bf16",
        &"--svd",
        &"randomized",
    ]) {
        assert_same_files(&dir.join("energy"), &reference, &ADAPTER_FILES);
    }

    let lora = Adapter::open(&lora_dir).unwrap();
    let report = convert_to_lora(&lora, dir.join("r2"), &rank_options(2)).unwrap();
    assert_eq!(report.len(), lora.module_count());
    assert!(report.iter().all(|m| m.rank == 2), "{report:?}");
    let reference = dir.join("r2-peftc");
    let (l, r) = (lora_dir.as_os_str(), reference.as_os_str());
    if peftc(&[&"adapter", &"convert", &l, &r, &"--to", &"lora", &"--rank", &"2"]) {
        assert_same_files(&dir.join("r2"), &reference, &ADAPTER_FILES);
    }

    convert_initial(&lora_dir, &lora_dir, dir.join("doubled"), None).unwrap();
    let doubled = Adapter::open(dir.join("doubled")).unwrap();
    assert_eq!(doubled.module_count(), lora.module_count());
    let reference = dir.join("doubled-peftc");
    let r = reference.as_os_str();
    if peftc(&[&"adapter", &"convert", &l, &r, &"--to", &"lora", &"--initial", &l]) {
        assert_same_files(&dir.join("doubled"), &reference, &ADAPTER_FILES);
    }

    // Errors with the library's codes.
    expect_code(convert_to_lora(&lora, dir.join("none"), &LowRankOptions::new().unwrap()), ErrorCode::InvalidArgument);
    expect_code(convert_to_lora(&lora, dir.join("big"), &rank_options(100_000)), ErrorCode::InvalidArgument);
    let dora = Adapter::open(fixture(&["adapters", "llama_dora"])).unwrap();
    expect_code(convert_to_lora(&dora, dir.join("dora"), &rank_options(2)), ErrorCode::Unsupported);
    expect_code(extract_lora(&base, &base, dir.join("same"), &rank_options(2)), ErrorCode::InvalidArgument);
    expect_code(LowRankOptions::new().unwrap().set_energy(1.5).map(|_| ()), ErrorCode::InvalidArgument);
    expect_code(LowRankOptions::new().unwrap().set_rank(0).map(|_| ()), ErrorCode::InvalidArgument);
    expect_code(LowRankOptions::new().unwrap().set_modules(&[""]).map(|_| ()), ErrorCode::InvalidArgument);
    expect_code(LowRankOptions::new().unwrap().set_dtype(Some(DType::F64)).map(|_| ()), ErrorCode::InvalidArgument);
    expect_code(
        convert_initial(&lora_dir, fixture(&["adapters", "llama_dora"]), dir.join("mixed"), None),
        ErrorCode::Unsupported,
    );
    expect_code(convert_initial(&lora_dir, dir.path(), dir.join("z"), None), ErrorCode::Io);
}

/// An IA3 adapter on the llama fixture's layer-0 k_proj (8 x 16), ia3_l = 1 + i / 16, as
/// tests/capi/test_lowrank.c writes it: multiplicative, so it converts against a base only.
fn write_ia3_adapter(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(
        dir.join("adapter_config.json"),
        r#"{"peft_type": "IA3", "target_modules": ["k_proj"], "feedforward_modules": [], "task_type": "CAUSAL_LM"}"#,
    )
    .unwrap();
    let header = r#"{"base_model.model.model.layers.0.self_attn.k_proj.ia3_l": {"dtype": "F32", "shape": [8, 1], "data_offsets": [0, 32]}}"#;
    let mut file = (header.len() as u64).to_le_bytes().to_vec();
    file.extend_from_slice(header.as_bytes());
    for i in 0..8 {
        file.extend_from_slice(&(1.0f32 + i as f32 / 16.0).to_le_bytes());
    }
    std::fs::write(dir.join("adapter_model.safetensors"), file).unwrap();
}

#[test]
fn conversion_against_a_base_writes_what_peftc_writes() {
    let dir = TempDir::new("lowrank-base");
    let ia3_dir = dir.join("ia3");
    write_ia3_adapter(&ia3_dir);
    let ia3 = Adapter::open(&ia3_dir).unwrap();
    let err = expect_code(convert_to_lora(&ia3, dir.join("nobase"), &rank_options(2)), ErrorCode::Unsupported);
    assert!(err.message().contains("IA3") && err.message().contains("base"), "{err}");

    let base = fixture(&["models", "llama"]);
    let mut opts = rank_options(2);
    opts.set_base(Some(base.as_path())).unwrap();
    let report = convert_to_lora(&ia3, dir.join("r2"), &opts).unwrap();
    assert_eq!(report.len(), 1, "{report:?}");
    assert_eq!((report[0].name.as_str(), report[0].rank), ("model.layers.0.self_attn.k_proj", 2));
    // dW = diag(l - 1) W is full rank: rank 2 loses some.
    assert!(report[0].error > 0.0 && report[0].error < 1.0, "{report:?}");
    let reference = dir.join("r2-peftc");
    let (a, b, r) = (ia3_dir.as_os_str(), base.as_os_str(), reference.as_os_str());
    if peftc(&[&"adapter", &"convert", &a, &r, &"--to", &"lora", &"--rank", &"2", &"--base", &b]) {
        assert_same_files(&dir.join("r2"), &reference, &ADAPTER_FILES);
    }

    opts.set_base(Some(fixture(&["models", "gpt2"]).as_path())).unwrap(); // no k_proj there
    expect_code(convert_to_lora(&ia3, dir.join("gpt2"), &opts), ErrorCode::NotFound);
    opts.set_base(None).unwrap(); // no base again
    expect_code(convert_to_lora(&ia3, dir.join("cleared"), &opts), ErrorCode::Unsupported);
}

#[test]
fn quantized_gguf_merge_with_output_type_and_store_report() {
    let dir = TempDir::new("quant");
    let base = fixture(&["gguf", "bindings_q8_0.gguf"]);
    let adapter = fixture(&["gguf", "bindings_q8_0_lora"]);
    for name in ["Q4_0", "Q8_0", "F16"] {
        let ggml = GgmlType::from_name(name).unwrap();
        let out = dir.join(&format!("{name}.gguf"));
        let mut opts = MergeOptions::new().unwrap();
        opts.add_adapter_dir(&adapter, 1.0).unwrap().set_quant(Some(ggml)).unwrap().set_report(true).unwrap();
        let result = merge_checkpoint(&base, &out, &opts).unwrap();
        assert_eq!(result.merged(), 1);
        let report: Value = serde_json::from_str(result.store_report_json()).unwrap();
        let entries = report.as_array().unwrap();
        assert_eq!(entries.len(), 1, "{report}");
        let e = &entries[0];
        assert_eq!(
            (e["tensor"].as_str(), e["base_type"].as_str(), e["type"].as_str()),
            (Some("blk.0.ffn_down.weight"), Some("Q8_0"), Some(name))
        );
        assert_eq!(e["values"].as_u64(), Some(512));
        let (rms, max) = (e["rms"].as_f64().unwrap(), e["max"].as_f64().unwrap());
        assert!(rms > 0.0 && rms <= max, "{e}");
        assert!(e["base_rms"].as_f64().unwrap() <= e["base_max"].as_f64().unwrap(), "{e}");
        let ckpt = Checkpoint::open(&out).unwrap();
        assert_eq!(ckpt.tensor_by_name("blk.0.ffn_down.weight").unwrap().ggml_type, Some(ggml));
        let reference = dir.join(&format!("peftc-{name}.gguf"));
        let (b, a, r) = (base.as_os_str(), adapter.as_os_str(), reference.as_os_str());
        if peftc(&[&"merge", &"--base", &b, &"--adapter", &a, &"--out", &r, &"--quant", &name, &"--report"]) {
            assert_eq!(
                std::fs::read(&out).unwrap(),
                std::fs::read(&reference).unwrap(),
                "{name}: differs from peftc's"
            );
        }
    }
    let mut plain = MergeOptions::new().unwrap();
    plain.add_adapter_dir(&adapter, 1.0).unwrap();
    assert_eq!(merge_checkpoint(&base, dir.join("kept.gguf"), &plain).unwrap().store_report_json(), "[]");
    let mut opts = MergeOptions::new().unwrap();
    expect_code(opts.set_quant(Some(GgmlType(999))).map(|_| ()), ErrorCode::InvalidArgument);
    expect_code(opts.set_quant(GgmlType::from_name("IQ2_XS")).map(|_| ()), ErrorCode::Unsupported);
    opts.add_adapter_dir(&adapter, 1.0)
        .unwrap()
        .set_quant(Some(GgmlType::Q8_0))
        .unwrap()
        .set_dtype(Some(DType::F16))
        .unwrap();
    expect_code(merge_checkpoint(&base, dir.join("x.gguf"), &opts), ErrorCode::InvalidArgument);
    assert!(!dir.join("x.gguf").exists());
}

/// One tensor of a model folder as f32.
fn weight(dir: &Path, name: &str) -> Vec<f32> {
    let ckpt = Checkpoint::open(dir.join("model.safetensors")).unwrap();
    ckpt.read_as::<f32>(ckpt.find(name).unwrap()).unwrap()
}

/// x [rows, n] times w [n, n] transposed, in f64.
fn matmul_t(x: &[f32], w: &[f32], n: usize) -> Vec<f64> {
    x.chunks(n)
        .flat_map(|row| w.chunks(n).map(move |wr| row.iter().zip(wr).map(|(&a, &b)| f64::from(a) * f64::from(b)).sum()))
        .collect()
}

fn to_f32(v: &[f64]) -> Vec<f32> {
    v.iter().map(|&x| x as f32).collect()
}

#[test]
fn dora_apply_with_the_base_weight_gives_the_merged_weight() {
    const MODULE: &str = "model.layers.0.self_attn.q_proj";
    const N: usize = 16;
    let dir = TempDir::new("dora");
    let base = fixture(&["models", "llama"]);
    let dora_dir = fixture(&["adapters", "llama_dora"]);
    let mut merge = MergeOptions::new().unwrap();
    merge.add_adapter_dir(&dora_dir, 1.0).unwrap();
    merge_checkpoint(&base, dir.join("merged"), &merge).unwrap();
    let weight_name = format!("{MODULE}.weight");
    // Declared before the registry: the library borrows it until the registry and its leases are gone.
    let mut w = weight(&base, &weight_name);
    let merged = weight(&dir.join("merged"), &weight_name);
    let x: Vec<f32> = (0..4 * N).map(|i| ((i * 37 % 23) as f32 - 11.0) / 7.0).collect();
    let y0 = to_f32(&matmul_t(&x, &w, N));
    let want = matmul_t(&x, &merged, N);

    let registry = Registry::new(DType::F32, 1 << 20, None).unwrap();
    registry.register("dora", &dora_dir, None).unwrap();
    let lease = registry.acquire("dora").unwrap();
    let apply = |y0: &[f32]| {
        let mut y = y0.to_vec();
        lora_apply(MODULE, &[&lease], None, BufferRef::F32(&x), N as u64, Buffer::F32(&mut y), N as u64).map(|_| y)
    };
    expect_code(apply(&y0), ErrorCode::NotFound); // no base weight yet
                                                  // SAFETY: `w` outlives the registry and the lease (declared before them), and changes only
                                                  // between applies, followed by base_weights_changed.
    unsafe { registry.set_base_weight(MODULE, BufferRef::F32(&w), &[N as u64, N as u64], None).unwrap() };
    let got = apply(&y0).unwrap();
    for (i, (&g, &e)) in got.iter().zip(&want).enumerate() {
        assert!((f64::from(g) - e).abs() <= 1e-5 * (1.0 + e.abs()), "element {i}: {g}, x W_merged^T = {e}");
    }

    // The host doubles its weight in place; the kept scale stays until base_weights_changed.
    let doubled: Vec<f32> = w.iter().map(|v| v * 2.0).collect();
    w.copy_from_slice(&doubled); // no apply runs while the contents change
    let y2 = to_f32(&matmul_t(&x, &doubled, N));
    let stale = apply(&y2).unwrap();
    registry.base_weights_changed().unwrap();
    let fresh = apply(&y2).unwrap();
    assert_ne!(stale, fresh, "base_weights_changed did not change the DoRA output");
    let other = Registry::new(DType::F32, 1 << 20, None).unwrap();
    other.register("dora", &dora_dir, None).unwrap();
    // SAFETY: `doubled` outlives `other` and its lease (both dropped at the end of this scope first).
    unsafe { other.set_base_weight(&weight_name, BufferRef::F32(&doubled), &[N as u64, N as u64], None).unwrap() };
    let other_lease = other.acquire("dora").unwrap();
    let mut y = y2.clone();
    lora_apply(MODULE, &[&other_lease], None, BufferRef::F32(&x), N as u64, Buffer::F32(&mut y), N as u64).unwrap();
    assert_eq!(y, fresh, "after base_weights_changed the output differs from a registry given the new weight");

    // Errors with the library's codes.
    let zero_bias: [f32; 0] = [];
    // SAFETY: every call below fails before the library keeps anything.
    unsafe {
        expect_code(registry.set_base_weight(MODULE, BufferRef::F32(&w), &[2, 8, 16], None), ErrorCode::ShapeMismatch);
        expect_code(
            registry.set_base_weight(MODULE, BufferRef::F32(&w[..8]), &[16, 16], None),
            ErrorCode::InvalidArgument,
        );
        expect_code(
            registry.set_base_weight(MODULE, BufferRef::F32(&w), &[16, 16], Some(BufferRef::F32(&zero_bias))),
            ErrorCode::ShapeMismatch,
        );
        expect_code(registry.set_base_weight("a\0b", BufferRef::F32(&w), &[16, 16], None), ErrorCode::InvalidArgument);
    }
    drop((lease, registry, other_lease, other));
}

/// ties (frequency majority sign) and dare_linear (seed 7) write the files `peftc adapter combine`
/// writes with the same settings; bad settings are refused.
#[test]
fn pruning_combinations_match_peftc() {
    let dir = TempDir::new("prune");
    let (first, second) = (fixture(&["adapters", "llama_lora"]), fixture(&["adapters", "llama_lora_second"]));
    let (a1, a2) = (Adapter::open(&first).unwrap(), Adapter::open(&second).unwrap());
    assert_eq!(a1.r(), a2.r());
    let (adapters, weights) = ([&a1, &a2], [1.0, 0.5]);
    let (in1, in2) = (format!("{}:1", first.display()), format!("{}:0.5", second.display()));
    // `peftc adapter combine` of the same inputs with `settings`, compared with the binding's output.
    let same_as_peftc = |ours: &str, method: &str, settings: [&str; 4]| {
        let reference = dir.join(&format!("{ours}-peftc"));
        let mut words: Vec<std::ffi::OsString> =
            ["adapter", "combine", "--adapter", &in1, "--adapter", &in2, "--method", method].map(Into::into).into();
        words.extend(settings.map(Into::into));
        words.extend(["--out".into(), reference.clone().into_os_string()]);
        let args: Vec<&dyn AsRef<std::ffi::OsStr>> = words.iter().map(|w| w as &dyn AsRef<std::ffi::OsStr>).collect();
        if peftc(&args) {
            assert_same_files(&dir.join(ours), &reference, &ADAPTER_FILES);
        }
    };

    let mut ties = ExportOptions::new().unwrap();
    ties.set_combine_density(0.5).unwrap().set_combine_majority_sign(MajoritySign::Frequency).unwrap();
    combine_adapters(&adapters, &weights, CombineMethod::Ties, dir.join("ties"), Some(&ties)).unwrap();
    same_as_peftc("ties", "ties", ["--density", "0.5", "--majority-sign", "frequency"]);

    let mut dare = ExportOptions::new().unwrap();
    dare.set_combine_density(0.5).unwrap().set_combine_seed(7).unwrap();
    combine_adapters(&adapters, &weights, CombineMethod::DareLinear, dir.join("dare"), Some(&dare)).unwrap();
    same_as_peftc("dare", "dare_linear", ["--density", "0.5", "--seed", "7"]);
    // Another seed draws other masks.
    dare.set_combine_seed(8).unwrap();
    combine_adapters(&adapters, &weights, CombineMethod::DareLinear, dir.join("dare8"), Some(&dare)).unwrap();
    let factors = |name: &str| std::fs::read(dir.join(name).join("adapter_model.safetensors")).unwrap();
    assert_ne!(factors("dare"), factors("dare8"));

    let raws = [CombineMethod::Ties, CombineMethod::DareLinear, CombineMethod::DareTies, CombineMethod::MagnitudePrune]
        .map(CombineMethod::raw);
    assert_eq!(raws, [2, 3, 4, 5]);
    assert_eq!((MajoritySign::default().raw(), MajoritySign::Frequency.raw()), (0, 1));

    let mut opts = ExportOptions::new().unwrap();
    for density in [-0.1, 1.5, f64::NAN] {
        expect_code(opts.set_combine_density(density).map(|_| ()), ErrorCode::InvalidArgument);
    }
    // The enum cannot hold another majority sign; the C function refuses one.
    // SAFETY: a live handle owned by `opts`, used by this thread only.
    let err = unsafe { peft_c::sys::peft_export_options_set_combine_majority_sign(opts.as_ptr().cast_mut(), 2) };
    assert!(!err.is_null());
    // SAFETY: an error the call returned, freed once.
    unsafe {
        assert_eq!(peft_c::sys::peft_error_code(err), peft_c::sys::PEFT_ERR_INVALID_ARGUMENT);
        peft_c::sys::peft_error_free(err);
    }
    // A pruning method without a density.
    expect_code(
        combine_adapters(&adapters, &weights, CombineMethod::DareTies, dir.join("nodensity"), None),
        ErrorCode::InvalidArgument,
    );
    assert!(!dir.join("nodensity").join("adapter_config.json").exists());
}

/// The SVD combinations (svd of adapters of unequal ranks; ties_svd with a rank and a clamp;
/// dare_ties_svd with a seed) write the files `peftc adapter combine` writes with the same settings;
/// bad SVD settings are refused.
#[test]
fn svd_combinations_match_peftc() {
    let dir = TempDir::new("svdcomb");
    let pattern = fixture(&["adapters", "llama_rank_alpha_pattern"]);
    let (first, second) = (fixture(&["adapters", "llama_lora"]), fixture(&["adapters", "llama_lora_second"]));
    let (ap, a1, a2) =
        (Adapter::open(&pattern).unwrap(), Adapter::open(&first).unwrap(), Adapter::open(&second).unwrap());
    // `peftc adapter combine` of `inputs` (weights 1 and 0.5) with `method` and `settings`, compared
    // with the binding's output.
    let same_as_peftc = |ours: &str, inputs: [&Path; 2], method: &str, settings: &[&str]| {
        let reference = dir.join(&format!("{ours}-peftc"));
        let mut words: Vec<std::ffi::OsString> = vec!["adapter".into(), "combine".into()];
        for (input, weight) in inputs.iter().zip(["1", "0.5"]) {
            words.extend(["--adapter".into(), format!("{}:{weight}", input.display()).into()]);
        }
        words.extend(["--method", method].map(Into::into));
        words.extend(settings.iter().map(Into::into));
        words.extend(["--out".into(), reference.clone().into_os_string()]);
        let args: Vec<&dyn AsRef<std::ffi::OsStr>> = words.iter().map(|w| w as &dyn AsRef<std::ffi::OsStr>).collect();
        if peftc(&args) {
            assert_same_files(&dir.join(ours), &reference, &ADAPTER_FILES);
        }
    };
    let weights = [1.0, 0.5];

    // svd: the ranks may differ (llama_rank_alpha_pattern has r = 4 and rank_pattern values 2 and 8);
    // the new rank is the largest of them.
    combine_adapters(&[&ap, &a1], &weights, CombineMethod::Svd, dir.join("svd"), None).unwrap();
    assert_eq!(Adapter::open(dir.join("svd")).unwrap().r(), 8);
    same_as_peftc("svd", [&pattern, &first], "svd", &[]);

    let mut ties = ExportOptions::new().unwrap();
    ties.set_combine_density(0.5).unwrap().set_combine_svd_rank(2).unwrap().set_combine_svd_clamp(Some(0.95)).unwrap();
    combine_adapters(&[&a1, &a2], &weights, CombineMethod::TiesSvd, dir.join("ties_svd"), Some(&ties)).unwrap();
    assert_eq!(Adapter::open(dir.join("ties_svd")).unwrap().r(), 2);
    same_as_peftc(
        "ties_svd",
        [&first, &second],
        "ties_svd",
        &["--density", "0.5", "--svd-rank", "2", "--svd-clamp", "0.95"],
    );

    let mut dare = ExportOptions::new().unwrap();
    dare.set_combine_density(0.4).unwrap().set_combine_seed(7).unwrap();
    combine_adapters(&[&a1, &a2], &weights, CombineMethod::DareTiesSvd, dir.join("dare_ties_svd"), Some(&dare))
        .unwrap();
    same_as_peftc("dare_ties_svd", [&first, &second], "dare_ties_svd", &["--density", "0.4", "--seed", "7"]);
    // A rank of 0 is the default, and None clears a clamp.
    dare.set_combine_svd_rank(0)
        .unwrap()
        .set_combine_svd_clamp(Some(0.5))
        .unwrap()
        .set_combine_svd_clamp(None)
        .unwrap();
    combine_adapters(&[&a1, &a2], &weights, CombineMethod::DareTiesSvd, dir.join("again"), Some(&dare)).unwrap();
    assert_same_files(&dir.join("dare_ties_svd"), &dir.join("again"), &ADAPTER_FILES);

    let raws = [
        CombineMethod::Svd,
        CombineMethod::TiesSvd,
        CombineMethod::DareLinearSvd,
        CombineMethod::DareTiesSvd,
        CombineMethod::MagnitudePruneSvd,
    ]
    .map(CombineMethod::raw);
    assert_eq!(raws, [6, 7, 8, 9, 10]);

    let mut opts = ExportOptions::new().unwrap();
    expect_code(opts.set_combine_svd_rank(-1).map(|_| ()), ErrorCode::InvalidArgument);
    expect_code(opts.set_combine_svd_clamp(Some(1.5)).map(|_| ()), ErrorCode::InvalidArgument);
    // A pruning SVD method without a density.
    expect_code(
        combine_adapters(&[&a1, &a2], &weights, CombineMethod::MagnitudePruneSvd, dir.join("nodensity"), None),
        ErrorCode::InvalidArgument,
    );
    assert!(!dir.join("nodensity").join("adapter_config.json").exists());
}

/// The ggml arithmetic into the Q8_0 GGUF fixture writes the file `peftc merge --arithmetic ggml`
/// writes; join_split has no effect on a base of one file; DoRA is refused in the ggml order.
#[test]
fn ggml_arithmetic_gguf_merge_matches_peftc() {
    let dir = TempDir::new("arith");
    let base = fixture(&["gguf", "bindings_q8_0.gguf"]);
    let adapter = fixture(&["gguf", "bindings_q8_0_lora"]);
    let spec = format!("{}:0.5", adapter.display());
    // Written F32 (Q8_0 rounds the two orders' last bits away on this fixture).
    let mut opts = MergeOptions::new().unwrap();
    opts.add_adapter_dir(&adapter, 0.5).unwrap().set_arithmetic(Arithmetic::Ggml).unwrap();
    opts.set_quant(Some(GgmlType::F32)).unwrap();
    assert_eq!(merge_checkpoint(&base, dir.join("ggml.gguf"), &opts).unwrap().merged(), 1);
    let mut peft_f32 = MergeOptions::new().unwrap();
    peft_f32.add_adapter_dir(&adapter, 0.5).unwrap().set_quant(Some(GgmlType::F32)).unwrap();
    merge_checkpoint(&base, dir.join("peft-f32.gguf"), &peft_f32).unwrap();
    let ggml = std::fs::read(dir.join("ggml.gguf")).unwrap();
    assert_ne!(ggml, std::fs::read(dir.join("peft-f32.gguf")).unwrap(), "the orders wrote the same F32 merge");
    let reference = dir.join("peftc-ggml.gguf");
    let (b, r) = (base.as_os_str(), reference.as_os_str());
    if peftc(&[
        &"merge",
        &"--base",
        &b,
        &"--adapter",
        &spec,
        &"--out",
        &r,
        &"--arithmetic",
        &"ggml",
        &"--quant",
        &"F32",
    ]) {
        assert_eq!(ggml, std::fs::read(&reference).unwrap());
    }
    // PEFT's order (the default) and join_split on a one-file base: peftc merge's file.
    let mut peft = MergeOptions::new().unwrap();
    peft.add_adapter_dir(&adapter, 0.5)
        .unwrap()
        .set_arithmetic(Arithmetic::Peft)
        .unwrap()
        .set_join_split(true)
        .unwrap();
    let result = merge_checkpoint(&base, dir.join("peft.gguf"), &peft).unwrap();
    assert_eq!(result.files(), ["peft.gguf"]);
    let reference = dir.join("peftc-peft.gguf");
    let r = reference.as_os_str();
    if peftc(&[&"merge", &"--base", &b, &"--adapter", &spec, &"--out", &r]) {
        assert_eq!(std::fs::read(dir.join("peft.gguf")).unwrap(), std::fs::read(&reference).unwrap());
    }
    assert_eq!(Arithmetic::default(), Arithmetic::Peft);

    let mut dora = MergeOptions::new().unwrap();
    dora.add_adapter_dir(fixture(&["adapters", "llama_dora"]), 1.0).unwrap().set_arithmetic(Arithmetic::Ggml).unwrap();
    expect_code(merge_checkpoint(fixture(&["models", "llama"]), dir.join("dora"), &dora), ErrorCode::Unsupported);
    assert!(!dir.join("dora").exists());
    // The enum cannot hold another order; the C function refuses one.
    let bad = MergeOptions::new().unwrap();
    // SAFETY: a live handle owned by `bad`, used by this thread only.
    let err = unsafe { peft_c::sys::peft_merge_options_set_arithmetic(bad.as_ptr().cast_mut(), 2) };
    assert!(!err.is_null());
    // SAFETY: an error the call returned, freed once.
    unsafe {
        assert_eq!(peft_c::sys::peft_error_code(err), peft_c::sys::PEFT_ERR_INVALID_ARGUMENT);
        peft_c::sys::peft_error_free(err);
    }
}

/// A metadata value of [`write_tiny_gguf`].
enum Kv {
    U16(u16),
    I32(i32),
    F32(f32),
    Str(&'static str),
}

/// Writes a GGUF file of F32 2 x 2 tensors (values `first`, `first + 0.25`, ...).
fn write_tiny_gguf(path: &Path, kvs: &[(&str, Kv)], names: &[&str], first: f32) {
    fn text(out: &mut Vec<u8>, s: &str) {
        out.extend_from_slice(&(s.len() as u64).to_le_bytes());
        out.extend_from_slice(s.as_bytes());
    }
    let mut out = b"GGUF".to_vec();
    out.extend_from_slice(&3u32.to_le_bytes());
    out.extend_from_slice(&(names.len() as u64).to_le_bytes());
    out.extend_from_slice(&(kvs.len() as u64).to_le_bytes());
    for (key, value) in kvs {
        text(&mut out, key);
        match value {
            Kv::U16(v) => out.extend(2u32.to_le_bytes().into_iter().chain(v.to_le_bytes())),
            Kv::I32(v) => out.extend(5u32.to_le_bytes().into_iter().chain(v.to_le_bytes())),
            Kv::F32(v) => out.extend(6u32.to_le_bytes().into_iter().chain(v.to_le_bytes())),
            Kv::Str(v) => {
                out.extend_from_slice(&8u32.to_le_bytes());
                text(&mut out, v);
            }
        }
    }
    for (i, name) in names.iter().enumerate() {
        text(&mut out, name);
        out.extend_from_slice(&2u32.to_le_bytes());
        out.extend_from_slice(&2u64.to_le_bytes());
        out.extend_from_slice(&2u64.to_le_bytes());
        out.extend_from_slice(&0u32.to_le_bytes());
        out.extend_from_slice(&(32 * i as u64).to_le_bytes());
    }
    out.resize((out.len() + 31) / 32 * 32, 0);
    for i in 0..names.len() {
        for k in 0..4 {
            out.extend_from_slice(&(first + (4 * i + k) as f32 * 0.25).to_le_bytes());
        }
        out.extend_from_slice(&[0; 16]);
    }
    std::fs::write(path, out).unwrap();
}

/// A base split into two parts merges into two parts by default and, with `set_join_split(true)`,
/// into the one file `peftc merge --join-split` writes.
#[test]
fn join_split_merges_a_split_gguf_base_into_one_file() {
    let dir = TempDir::new("join");
    for (no, name) in ["blk.0.attn_v.weight", "blk.0.ffn_down.weight"].into_iter().enumerate() {
        let mut kvs = Vec::new();
        if no == 0 {
            kvs.push(("general.architecture", Kv::Str("llama")));
        }
        kvs.extend([
            ("split.no", Kv::U16(no as u16)),
            ("split.tensors.count", Kv::I32(2)),
            ("split.count", Kv::U16(2)),
        ]);
        write_tiny_gguf(
            &dir.join(&format!("model-0000{}-of-00002.gguf", no + 1)),
            &kvs,
            &[name],
            1.0 - 2.0 * no as f32,
        );
    }
    let lora = dir.join("lora.gguf");
    let kvs = [
        ("general.architecture", Kv::Str("llama")),
        ("general.type", Kv::Str("adapter")),
        ("adapter.type", Kv::Str("lora")),
        ("adapter.lora.alpha", Kv::F32(2.0)),
    ];
    write_tiny_gguf(&lora, &kvs, &["blk.0.ffn_down.weight.lora_a", "blk.0.ffn_down.weight.lora_b"], 0.5);
    let base = dir.join("model-00002-of-00002.gguf");
    let mut opts = MergeOptions::new().unwrap();
    opts.add_adapter_dir(&lora, 1.0).unwrap();
    let parts = merge_checkpoint(&base, dir.join("out.gguf"), &opts).unwrap();
    assert_eq!(parts.files(), ["out-00001-of-00002.gguf", "out-00002-of-00002.gguf"]);
    opts.set_join_split(true).unwrap();
    let joined = merge_checkpoint(&base, dir.join("joined.gguf"), &opts).unwrap();
    assert_eq!(joined.files(), ["joined.gguf"]);
    let reference = dir.join("peftc.gguf");
    let (b, l, r) = (base.as_os_str(), lora.as_os_str(), reference.as_os_str());
    if peftc(&[&"merge", &"--base", &b, &"--adapter", &l, &"--out", &r, &"--join-split"]) {
        assert_eq!(std::fs::read(dir.join("joined.gguf")).unwrap(), std::fs::read(&reference).unwrap());
    }
}

/// `combine_deltas` of llama_lora (0.7) and llama_rank_alpha_pattern (-1.3): exact with linear (every
/// module's error 0) and ties at rank 4 write the files `peftc adapter combine --deltas` writes with
/// the same settings; the refused combinations write nothing.
#[test]
fn delta_combinations_match_peftc() {
    let dir = TempDir::new("deltacomb");
    let (lora, pattern) = (fixture(&["adapters", "llama_lora"]), fixture(&["adapters", "llama_rank_alpha_pattern"]));
    let (a1, ap) = (Adapter::open(&lora).unwrap(), Adapter::open(&pattern).unwrap());
    let weights = [0.7, -1.3];
    let same_as_peftc = |ours: &str, method: &str, settings: &[&str]| {
        let reference = dir.join(&format!("{ours}-peftc"));
        let mut words: Vec<std::ffi::OsString> = vec!["adapter".into(), "combine".into(), "--deltas".into()];
        for (input, weight) in [&lora, &pattern].iter().zip(["0.7", "-1.3"]) {
            words.extend(["--adapter".into(), format!("{}:{weight}", input.display()).into()]);
        }
        words.extend(["--method", method].map(Into::into));
        words.extend(settings.iter().map(Into::into));
        words.extend(["--out".into(), reference.clone().into_os_string()]);
        let args: Vec<&dyn AsRef<std::ffi::OsStr>> = words.iter().map(|w| w as &dyn AsRef<std::ffi::OsStr>).collect();
        if peftc(&args) {
            assert_same_files(&dir.join(ours), &reference, &ADAPTER_FILES);
        }
    };

    // Exact: no options at all; each module's rank is the sum of the adapters' ranks, its error 0.
    let exact = combine_deltas(&[&a1, &ap], &weights, CombineMethod::Linear, dir.join("exact"), None, None).unwrap();
    assert!(!exact.is_empty());
    for m in &exact {
        assert!(m.error == 0.0 && m.rank >= 1 && !m.name.is_empty(), "exact: {m:?}");
    }
    same_as_peftc("exact", "linear", &[]);

    // TIES on the deltas, truncated to rank 4.
    let mut density = ExportOptions::new().unwrap();
    density.set_combine_density(0.5).unwrap();
    let ties = combine_deltas(
        &[&a1, &ap],
        &weights,
        CombineMethod::Ties,
        dir.join("ties"),
        Some(&density),
        Some(&rank_options(4)),
    )
    .unwrap();
    assert!(!ties.is_empty());
    for m in &ties {
        assert!(m.rank == 4 && (0.0..1.0).contains(&m.error), "ties: {m:?}");
    }
    same_as_peftc("ties", "ties", &["--density", "0.5", "--rank", "4"]);

    // Refused, writing nothing: ties without a density; exact with ties; a DoRA input; the svd method
    // (a combination of factors only); a count mismatch.
    let refused = |name: &str, result: peft_c::Result<Vec<peft_c::LowRankModule>>, code: ErrorCode| {
        expect_code(result, code);
        assert!(!dir.join(name).exists(), "a refused combination wrote {name}");
    };
    let rank4 = rank_options(4);
    refused(
        "nodensity",
        combine_deltas(&[&a1, &ap], &weights, CombineMethod::Ties, dir.join("nodensity"), None, Some(&rank4)),
        ErrorCode::InvalidArgument,
    );
    refused(
        "exact_ties",
        combine_deltas(&[&a1, &ap], &weights, CombineMethod::Ties, dir.join("exact_ties"), Some(&density), None),
        ErrorCode::InvalidArgument,
    );
    let dora = Adapter::open(fixture(&["adapters", "llama_dora"])).unwrap();
    refused(
        "dora",
        combine_deltas(&[&a1, &dora], &weights, CombineMethod::Linear, dir.join("dora"), None, None),
        ErrorCode::Unsupported,
    );
    refused(
        "svd",
        combine_deltas(&[&a1, &ap], &weights, CombineMethod::Svd, dir.join("svd"), None, Some(&rank4)),
        ErrorCode::InvalidArgument,
    );
    refused(
        "count",
        combine_deltas(&[&a1, &ap], &weights[..1], CombineMethod::Linear, dir.join("count"), None, None),
        ErrorCode::InvalidArgument,
    );
}
