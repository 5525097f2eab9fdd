//! Serving: the registry (lazy loading, stats, the byte budget and its errors, replacement and
//! removal under leases, leases outliving the registry, registries and leases shared across
//! threads), lora_apply against the product computed here in f64 from the adapters' factors, and
//! host-model swaps (against merge_into of the same factors, restoring the buffers bit for bit).

mod common;

use std::path::PathBuf;
use std::sync::Arc;

use common::{expect_code, fixture};
use peft_c::{
    lora_apply, merge_into, Adapter, AdapterOptions, Buffer, BufferRef, Checkpoint, DType, ErrorCode, HostModel,
    LayerKind, Lease, MergeBufferOptions, Module, Registry,
};

const LORA: &str = "llama_lora";
const SECOND: &str = "llama_lora_second";
const LOTS: u64 = 1 << 30;

fn adapter_dir(name: &str) -> PathBuf {
    fixture(&["adapters", name])
}

fn open(name: &str) -> Adapter {
    Adapter::open(adapter_dir(name)).unwrap()
}

/// A registry with `names[i]` registered from the fixture adapter `dirs[i]`.
fn registry_with(storage: DType, budget: u64, entries: &[(&str, &str)]) -> Registry {
    let registry = Registry::new(storage, budget, None).unwrap();
    for (name, dir) in entries {
        registry.register(name, adapter_dir(dir), None).unwrap();
    }
    registry
}

/// What a registry charges for an adapter: every tensor of its LoRA layers in the storage dtype.
fn charged_bytes(adapter: &Adapter, storage: DType) -> u64 {
    adapter
        .modules()
        .filter(|m| m.kind().is_lora())
        .flat_map(|m| m.tensors())
        .map(|t| t.num_elements() * u64::from(storage.bits()) / 8)
        .sum()
}

fn bits(values: &[f32]) -> Vec<u32> {
    values.iter().map(|v| v.to_bits()).collect()
}

/// Deterministic values in [-1, 1).
fn pseudo_random(count: usize, seed: u64) -> Vec<f32> {
    let mut state = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    (0..count)
        .map(|_| {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((state >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

/// F32 values rounded to a 16-bit dtype (as their bits), through the library's conversion.
fn to_16(dtype: DType, values: &[f32]) -> Vec<u16> {
    let raw: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    let mut out = vec![0u8; values.len() * 2];
    peft_c::convert(DType::F32, &raw, dtype, &mut out).unwrap();
    out.chunks_exact(2).map(|c| u16::from_le_bytes([c[0], c[1]])).collect()
}

/// 16-bit values (bits) widened to F32.
fn from_16(dtype: DType, values: &[u16]) -> Vec<f32> {
    let raw: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    let mut out = vec![0u8; values.len() * 4];
    peft_c::convert(dtype, &raw, DType::F32, &mut out).unwrap();
    common::f32s(&out)
}

/// A Linear LoRA layer's factors as F32: A [r, in], B [out, r], and its scaling.
struct Factors {
    a: Vec<f32>,
    b: Vec<f32>,
    rank: usize,
    inputs: usize,
    outputs: usize,
    scaling: f64,
}

impl Factors {
    fn of(module: Module<'_>) -> Factors {
        assert_eq!(module.kind(), LayerKind::Linear, "{module:?}");
        let a_t = module.tensor_by_role("lora_A.weight").unwrap();
        let b_t = module.tensor_by_role("lora_B.weight").unwrap();
        Factors {
            a: a_t.read_as::<f32>().unwrap(),
            b: b_t.read_as::<f32>().unwrap(),
            rank: a_t.shape()[0] as usize,
            inputs: a_t.shape()[1] as usize,
            outputs: b_t.shape()[0] as usize,
            scaling: module.scaling(),
        }
    }

    /// The factors as a registry storing them in `storage` holds them.
    fn stored_as(mut self, storage: DType) -> Factors {
        if storage != DType::F32 {
            self.a = from_16(storage, &to_16(storage, &self.a));
            self.b = from_16(storage, &to_16(storage, &self.b));
        }
        self
    }

    /// y + scaling * (x A^T) B^T for each row of `x`, in f64, with each element's magnitude
    /// |y| + |scaling| * sum_k |x A^T|_k |B_ok| (which bounds the rounding error of F32 arithmetic).
    fn apply(&self, x: &[f32], y: &[f32]) -> (Vec<f64>, Vec<f64>) {
        let rows = x.len() / self.inputs;
        let (mut want, mut magnitude) = (Vec::new(), Vec::new());
        for row in 0..rows {
            let x_row = &x[row * self.inputs..(row + 1) * self.inputs];
            let (xa, xa_abs): (Vec<f64>, Vec<f64>) = (0..self.rank)
                .map(|k| {
                    let a_row = &self.a[k * self.inputs..(k + 1) * self.inputs];
                    let terms = x_row.iter().zip(a_row).map(|(x, a)| f64::from(*x) * f64::from(*a));
                    terms.fold((0.0, 0.0), |(s, m), t| (s + t, m + t.abs()))
                })
                .unzip();
            for o in 0..self.outputs {
                let base = f64::from(y[row * self.outputs + o]);
                let (mut sum, mut abs) = (0.0, 0.0);
                for k in 0..self.rank {
                    let b = f64::from(self.b[o * self.rank + k]);
                    sum += xa[k] * b;
                    abs += xa_abs[k] * b.abs();
                }
                want.push(base + self.scaling * sum);
                magnitude.push(base.abs() + self.scaling.abs() * abs);
            }
        }
        (want, magnitude)
    }
}

/// F32 arithmetic on terms of this magnitude errs by at most a few units of 2^-24 of it.
fn close_to(got: f32, want: f64, magnitude: f64) -> bool {
    (f64::from(got) - want).abs() <= 16.0 * f64::powi(2.0, -24) * magnitude
}

#[track_caller]
fn assert_rows_close(got: &[f32], want: &(Vec<f64>, Vec<f64>), what: &str) {
    assert_eq!(got.len(), want.0.len(), "{what}");
    for (i, (&got, (&want, &magnitude))) in got.iter().zip(want.0.iter().zip(&want.1)).enumerate() {
        assert!(close_to(got, want, magnitude), "{what}: element {i} is {got}, want {want}");
    }
}

fn send_sync<T: Send + Sync>() {}
fn send<T: Send>() {}

#[test]
fn marker_traits_follow_the_header() {
    send_sync::<Registry>();
    send_sync::<Lease>();
    send_sync::<Arc<Lease>>();
    // One thread at a time (that it is not Sync is checked by a compile_fail doctest in lib.rs).
    send::<HostModel<'static>>();
}

#[test]
fn names_round_trip_through_the_list() {
    // Every name the library accepts comes back unchanged, in registration order: a trailing
    // carriage return, spaces, a tab, non-ASCII text.
    let names = ["ends in CR\r", " spaced ", "a\tb", "ünïcode"];
    let registry = registry_with(DType::F32, LOTS, &names.map(|name| (name, LORA)));
    assert_eq!(registry.names().unwrap(), names);
}

#[test]
fn registry_loads_on_first_acquire_and_counts() {
    let lora = open(LORA);
    let registry = registry_with(DType::F32, LOTS, &[("a", LORA), ("b", SECOND)]);
    assert_eq!(registry.names().unwrap(), ["a", "b"]);
    let stats = registry.stats().unwrap();
    assert_eq!(
        (stats.budget_bytes, stats.registered, stats.loaded, stats.loaded_bytes, stats.loads),
        (LOTS, 2, 0, 0, 0)
    );

    let bytes = charged_bytes(&lora, DType::F32);
    let a = registry.acquire("a").unwrap();
    assert_eq!((a.name(), a.version(), a.bytes()), ("a", 1, bytes), "{a:?}");
    for module in lora.modules() {
        assert!(a.has_module(module.name()), "{}", module.name());
        assert!(a.has_module(&format!("base_model.model.{}.weight", module.name())), "{}", module.name());
    }
    assert!(!a.has_module("model.layers.0.self_attn.nothing"));
    assert!(!a.has_module("model.layers.0\0.self_attn.q_proj"));
    let stats = registry.stats().unwrap();
    assert_eq!((stats.loaded, stats.pinned, stats.loads, stats.hits), (1, 1, 1, 0), "{stats:?}");
    assert_eq!((stats.loaded_bytes, stats.peak_loaded_bytes), (bytes, bytes));

    // A second acquisition finds the tensors in memory: the same version, one load.
    let a2 = registry.acquire("a").unwrap();
    assert_eq!(a2.version(), a.version());
    let stats = registry.stats().unwrap();
    assert_eq!((stats.loaded, stats.pinned, stats.loads, stats.hits), (1, 1, 1, 1), "{stats:?}");
    let b = registry.acquire("b").unwrap();
    assert_eq!((b.name(), b.version()), ("b", 2));
    assert_eq!(registry.stats().unwrap().loaded_bytes, 2 * bytes);

    // Released adapters stay loaded (a later acquisition is a hit) until evicted.
    drop((a, a2, b));
    let stats = registry.stats().unwrap();
    assert_eq!((stats.loaded, stats.pinned), (2, 0), "{stats:?}");
    drop(registry.acquire("a").unwrap());
    assert_eq!(registry.stats().unwrap().hits, 2);
    registry.trim().unwrap();
    let stats = registry.stats().unwrap();
    assert_eq!((stats.loaded, stats.loaded_bytes, stats.evictions, stats.loads), (0, 0, 2, 2), "{stats:?}");
    assert_eq!(stats.peak_loaded_bytes, 2 * bytes);
    // After an eviction the next acquisition loads again.
    drop(registry.acquire("a").unwrap());
    assert_eq!(registry.stats().unwrap().loads, 3);

    // BF16 and F16 storage take half the bytes.
    for storage in [DType::BF16, DType::F16] {
        let half = registry_with(storage, LOTS, &[("a", LORA)]);
        assert_eq!(half.acquire("a").unwrap().bytes(), bytes / 2, "{storage}");
    }
}

#[test]
fn registry_errors_leave_it_unchanged() {
    for storage in [DType::F64, DType::I32, DType::U8] {
        expect_code(Registry::new(storage, LOTS, None), ErrorCode::InvalidArgument);
    }
    let registry = registry_with(DType::F32, LOTS, &[("a", LORA)]);
    expect_code(registry.acquire("missing"), ErrorCode::NotFound);
    expect_code(registry.unregister("missing"), ErrorCode::NotFound);
    expect_code(registry.register("", adapter_dir(SECOND), None), ErrorCode::InvalidArgument);
    expect_code(registry.register("a\0b", adapter_dir(SECOND), None), ErrorCode::InvalidArgument);
    expect_code(registry.acquire("a\0"), ErrorCode::InvalidArgument);
    // A failed replacement keeps the adapter of that name.
    expect_code(registry.register("a", adapter_dir("no_such_adapter"), None), ErrorCode::NotFound);
    let config = std::fs::read_to_string(adapter_dir(SECOND).join("adapter_config.json")).unwrap();
    let weights = std::fs::read(adapter_dir(SECOND).join("adapter_model.safetensors")).unwrap();
    expect_code(registry.register_memory("a", "{", &weights, None), ErrorCode::InvalidConfig);
    expect_code(registry.register_memory("a", &config, &weights[..3], None), ErrorCode::HeaderTooSmall);
    // Validation against a base model that does not fit (gpt2's layers are not llama's).
    let mut options = AdapterOptions::new().unwrap();
    options.set_base_dir(Some(&fixture(&["models", "gpt2"]))).unwrap();
    assert!(registry.register("a", adapter_dir(SECOND), Some(&options)).is_err());
    assert_eq!(registry.names().unwrap(), ["a"]);
    assert_eq!(registry.acquire("a").unwrap().version(), 1);
    assert_eq!(registry.stats().unwrap().registered, 1);
}

#[test]
fn budget_evicts_least_recently_used_and_refuses_what_cannot_fit() {
    let bytes = charged_bytes(&open(LORA), DType::F32);
    assert_eq!(bytes, charged_bytes(&open(SECOND), DType::F32));
    // Room for two of the three.
    let registry = registry_with(DType::F32, 2 * bytes, &[("a", LORA), ("b", SECOND), ("c", LORA)]);
    let a = registry.acquire("a").unwrap();
    let b = registry.acquire("b").unwrap();
    expect_code(registry.acquire("c"), ErrorCode::OverBudget); // both pinned
    drop((a, b));
    drop(registry.acquire("a").unwrap()); // a hit: a is now the most recently used
    drop(registry.acquire("c").unwrap()); // evicts b
    let stats = registry.stats().unwrap();
    assert_eq!((stats.loaded, stats.loaded_bytes, stats.evictions, stats.hits), (2, 2 * bytes, 1, 1), "{stats:?}");
    drop(registry.acquire("a").unwrap()); // still loaded: a hit
    assert_eq!(registry.stats().unwrap().hits, 2);

    // A budget below what is pinned is refused, with nothing evicted.
    let a = registry.acquire("a").unwrap();
    expect_code(registry.set_budget(bytes - 1), ErrorCode::OverBudget);
    let stats = registry.stats().unwrap();
    assert_eq!((stats.budget_bytes, stats.loaded, stats.evictions), (2 * bytes, 2, 1), "{stats:?}");
    registry.set_budget(bytes).unwrap(); // evicts c, keeps the pinned a
    let stats = registry.stats().unwrap();
    assert_eq!((stats.budget_bytes, stats.loaded, stats.evictions), (bytes, 1, 2), "{stats:?}");
    drop(a);
    registry.set_budget(bytes - 1).unwrap();
    let stats = registry.stats().unwrap();
    assert_eq!((stats.loaded, stats.loaded_bytes, stats.peak_loaded_bytes), (0, 0, 2 * bytes), "{stats:?}");
    // An adapter larger than the whole budget never loads.
    expect_code(registry.acquire("a"), ErrorCode::OverBudget);
    assert_eq!(registry.stats().unwrap().loaded_bytes, 0);
}

/// The module paths of an adapter's layers with their factors.
fn layers(adapter: &Adapter, storage: DType) -> Vec<(String, Factors)> {
    adapter.modules().map(|m| (m.name().to_string(), Factors::of(m).stored_as(storage))).collect()
}

#[test]
fn lora_apply_adds_the_product_of_the_factors() {
    let registry = registry_with(DType::F32, LOTS, &[("a", LORA), ("b", SECOND)]);
    let (a, b) = (registry.acquire("a").unwrap(), registry.acquire("b").unwrap());
    let (lora, second) = (layers(&open(LORA), DType::F32), layers(&open(SECOND), DType::F32));
    let rows = 5;
    for ((module, fa), (_, fb)) in lora.iter().zip(&second) {
        let x = pseudo_random(rows * fa.inputs, 1);
        let y0 = pseudo_random(rows * fa.outputs, 2);
        let (inputs, outputs) = (fa.inputs as u64, fa.outputs as u64);

        // Every row through one adapter, named by module path or weight name.
        for name in [module.clone(), format!("base_model.model.{module}.weight")] {
            let mut y = y0.clone();
            lora_apply(&name, &[&a], None, BufferRef::F32(&x), inputs, Buffer::F32(&mut y), outputs).unwrap();
            assert_rows_close(&y, &fa.apply(&x, &y0), &name);
        }

        // A mixed batch: rows 0 and 4 use a, 1 and 3 use b, 2 none.
        let mut y = y0.clone();
        let row_lease = [0, 1, -1, 1, 0];
        lora_apply(module, &[&a, &b], Some(&row_lease), BufferRef::F32(&x), inputs, Buffer::F32(&mut y), outputs)
            .unwrap();
        let (want_a, want_b) = (fa.apply(&x, &y0), fb.apply(&x, &y0));
        let out = fa.outputs;
        for (row, &index) in row_lease.iter().enumerate() {
            let span = row * out..(row + 1) * out;
            let got = &y[span.clone()];
            match index {
                -1 => assert_eq!(bits(got), bits(&y0[span]), "{module}: row {row} without adapter changed"),
                _ => {
                    let want = if index == 0 { &want_a } else { &want_b };
                    let want = (want.0[span.clone()].to_vec(), want.1[span].to_vec());
                    assert_rows_close(got, &want, &format!("{module} row {row}"));
                }
            }
        }
    }

    // A layer the adapters do not have leaves every row as it was.
    let x = pseudo_random(3 * 16, 3);
    let y0 = pseudo_random(3 * 64, 4);
    let mut y = y0.clone();
    lora_apply("lm_head", &[&a, &b], Some(&[0, 1, 0]), BufferRef::F32(&x), 16, Buffer::F32(&mut y), 64).unwrap();
    assert_eq!(bits(&y), bits(&y0));
    // No rows: nothing to do.
    let (module, factors) = &lora[0];
    let (inputs, outputs) = (factors.inputs as u64, factors.outputs as u64);
    lora_apply(module, &[&a], None, BufferRef::F32(&[]), inputs, Buffer::F32(&mut []), outputs).unwrap();
}

#[test]
fn lora_apply_in_16_bit_storage_and_outputs() {
    let module = "model.layers.1.mlp.down_proj";
    let rows = 4;
    for storage in [DType::BF16, DType::F16] {
        let registry = registry_with(storage, LOTS, &[("a", LORA)]);
        let lease = registry.acquire("a").unwrap();
        let factors = Factors::of(open(LORA).find_module(module).unwrap()).stored_as(storage);
        let (inputs, outputs) = (factors.inputs as u64, factors.outputs as u64);
        let x = pseudo_random(rows * factors.inputs, 5);
        let y0 = pseudo_random(rows * factors.outputs, 6);

        // F32 activations: the factors as stored (rounded once to the storage dtype).
        let mut y = y0.clone();
        lora_apply(module, &[&lease], None, BufferRef::F32(&x), inputs, Buffer::F32(&mut y), outputs).unwrap();
        assert_rows_close(&y, &factors.apply(&x, &y0), &format!("{storage} storage"));

        // 16-bit activations and outputs: computed in F32, rounded once into y's dtype.
        for dtype in [DType::BF16, DType::F16] {
            let x16 = to_16(dtype, &x);
            let mut y16 = to_16(dtype, &y0);
            let (x_wide, y0_wide) = (from_16(dtype, &x16), from_16(dtype, &y16));
            let input = if dtype == DType::BF16 { BufferRef::BF16(&x16) } else { BufferRef::F16(&x16) };
            let output = if dtype == DType::BF16 { Buffer::BF16(&mut y16) } else { Buffer::F16(&mut y16) };
            lora_apply(module, &[&lease], None, input, inputs, output, outputs).unwrap();
            let (want, magnitude) = factors.apply(&x_wide, &y0_wide);
            let half_ulp = if dtype == DType::BF16 { f64::powi(2.0, -8) } else { f64::powi(2.0, -11) };
            for (i, got) in from_16(dtype, &y16).into_iter().enumerate() {
                let bound = half_ulp * want[i].abs() + 16.0 * f64::powi(2.0, -24) * magnitude[i] + 1e-7;
                assert!(
                    (f64::from(got) - want[i]).abs() <= bound,
                    "{storage}/{dtype} element {i}: {got} vs {}",
                    want[i]
                );
            }
        }
    }
}

#[test]
fn lora_apply_errors_leave_the_output_unchanged() {
    let registry = registry_with(DType::F32, LOTS, &[("support", LORA), ("dora", "llama_dora")]);
    let (a, dora) = (registry.acquire("support").unwrap(), registry.acquire("dora").unwrap());
    let module = "model.layers.0.self_attn.q_proj"; // 16 -> 16
    let x = pseudo_random(2 * 16, 7);
    let y0 = pseudo_random(2 * 16, 8);
    let mut y = y0.clone();
    let mut apply = |leases: &[&Lease], row_lease: Option<&[i32]>, x: &[f32], inputs: u64, outputs: u64| {
        lora_apply(module, leases, row_lease, BufferRef::F32(x), inputs, Buffer::F32(&mut y), outputs)
    };
    // Checked by the binding: buffers of whole rows of the same count, indices for every row.
    expect_code(apply(&[], None, &x, 16, 16), ErrorCode::InvalidArgument);
    expect_code(apply(&[&a], None, &x, 0, 16), ErrorCode::InvalidArgument);
    expect_code(apply(&[&a], None, &x[..31], 16, 16), ErrorCode::InvalidArgument);
    expect_code(apply(&[&a], None, &x, 16, 15), ErrorCode::InvalidArgument);
    expect_code(apply(&[&a], Some(&[0]), &x, 16, 16), ErrorCode::InvalidArgument);
    // Checked by the library.
    expect_code(apply(&[&a], Some(&[0, 1]), &x, 16, 16), ErrorCode::InvalidArgument);
    expect_code(apply(&[&a], Some(&[0, -2]), &x, 16, 16), ErrorCode::InvalidArgument);
    let err = expect_code(apply(&[&a], None, &x, 8, 8), ErrorCode::ShapeMismatch); // 4 rows of 8 -> 8
    assert!(err.message().contains("support"), "{err}");
    // A DoRA layer needs the host's base weight (peft_registry_set_base_weight) before it applies.
    expect_code(apply(&[&a, &dora], Some(&[0, 1]), &x, 16, 16), ErrorCode::NotFound);
    let mut z = y0.clone();
    expect_code(
        lora_apply("q\0", &[&a], None, BufferRef::F32(&x), 16, Buffer::F32(&mut z), 16),
        ErrorCode::InvalidArgument,
    );
    assert_eq!(bits(&y), bits(&y0), "a failed lora_apply changed the output");
}

#[test]
fn replaced_and_unregistered_adapters_serve_their_leases_beyond_the_registry() {
    let registry = registry_with(DType::F32, LOTS, &[("a", LORA)]);
    let old = registry.acquire("a").unwrap();
    registry.register("a", adapter_dir(SECOND), None).unwrap(); // replaces a for new acquisitions
    let new = registry.acquire("a").unwrap();
    assert!(new.version() > old.version(), "{old:?} {new:?}");
    assert_eq!(registry.names().unwrap(), ["a"]);
    let stats = registry.stats().unwrap();
    assert_eq!((stats.registered, stats.loaded, stats.pinned), (1, 2, 2), "{stats:?}");

    let module = "model.layers.0.mlp.up_proj"; // 16 -> 32
    let (fa, fb) =
        (Factors::of(open(LORA).find_module(module).unwrap()), Factors::of(open(SECOND).find_module(module).unwrap()));
    let x = pseudo_random(3 * 16, 9);
    let y0 = pseudo_random(3 * 32, 10);
    let check = |lease: &Lease, factors: &Factors, what: &str| {
        let mut y = y0.clone();
        lora_apply(module, &[lease], None, BufferRef::F32(&x), 16, Buffer::F32(&mut y), 32).unwrap();
        assert_rows_close(&y, &factors.apply(&x, &y0), what);
    };
    check(&old, &fa, "the replaced version");
    check(&new, &fb, "the replacement");

    registry.unregister("a").unwrap();
    assert!(registry.names().unwrap().is_empty());
    expect_code(registry.acquire("a"), ErrorCode::NotFound);
    check(&old, &fa, "the replaced version after unregister");
    drop(registry);
    check(&old, &fa, "the replaced version after the registry");
    check(&new, &fb, "the replacement after the registry");
    assert_eq!(new.name(), "a");
}

#[test]
fn adapters_registered_from_memory_serve_as_from_their_folder() {
    let registry = Registry::new(DType::F32, LOTS, None).unwrap();
    {
        let config = std::fs::read_to_string(adapter_dir(LORA).join("adapter_config.json")).unwrap();
        let weights = std::fs::read(adapter_dir(LORA).join("adapter_model.safetensors")).unwrap();
        registry.register_memory("memory", &config, &weights, None).unwrap();
    } // the registry copied them
    registry.register("folder", adapter_dir(LORA), None).unwrap();
    let (memory, folder) = (registry.acquire("memory").unwrap(), registry.acquire("folder").unwrap());
    assert_eq!(memory.bytes(), folder.bytes());
    let module = "model.layers.1.self_attn.v_proj"; // 16 -> 8
    let x = pseudo_random(4 * 16, 11);
    let y0 = pseudo_random(4 * 8, 12);
    let (mut y1, mut y2) = (y0.clone(), y0.clone());
    lora_apply(module, &[&memory], None, BufferRef::F32(&x), 16, Buffer::F32(&mut y1), 8).unwrap();
    lora_apply(module, &[&folder], None, BufferRef::F32(&x), 16, Buffer::F32(&mut y2), 8).unwrap();
    assert_eq!(bits(&y1), bits(&y2));
    assert_ne!(bits(&y1), bits(&y0));
}

#[test]
fn registry_and_leases_are_shared_across_threads() {
    let bytes = charged_bytes(&open(LORA), DType::F32);
    // Room for two of three adapters: threads evict each other's and sometimes find no room.
    let registry = registry_with(DType::F32, 2 * bytes, &[("a", LORA), ("b", SECOND), ("c", LORA)]);
    let module = "model.layers.0.mlp.down_proj"; // 32 -> 16
    let x = pseudo_random(6 * 32, 13);
    let y0 = pseudo_random(6 * 16, 14);
    let apply = |lease: &Lease| {
        let mut y = y0.clone();
        lora_apply(module, &[lease], None, BufferRef::F32(&x), 32, Buffer::F32(&mut y), 16).unwrap();
        bits(&y)
    };
    let expected: Vec<Vec<u32>> = ["a", "b", "c"].iter().map(|name| apply(&registry.acquire(name).unwrap())).collect();
    assert_eq!(expected[0], expected[2]);
    registry.trim().unwrap();

    let shared = Arc::new(registry.acquire("b").unwrap());
    let served = std::sync::atomic::AtomicU64::new(0);
    std::thread::scope(|scope| {
        for thread in 0..8usize {
            let (registry, shared, expected, served) = (&registry, Arc::clone(&shared), &expected, &served);
            let apply = &apply;
            scope.spawn(move || {
                for round in 0..40 {
                    let which = (thread + round) % 3;
                    match registry.acquire(["a", "b", "c"][which]) {
                        Ok(lease) => {
                            assert!(apply(&lease) == expected[which], "thread {thread} round {round}");
                            served.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        }
                        // Two adapters pinned by other threads leave no room for a third.
                        Err(e) => assert_eq!(e.code(), ErrorCode::OverBudget, "{e}"),
                    }
                    assert!(apply(&shared) == expected[1], "the shared lease, thread {thread}");
                    assert!(registry.stats().unwrap().loaded_bytes <= 2 * bytes);
                }
            });
        }
    });
    // b, pinned by the shared lease, is always served (13 or 14 rounds of 40 per thread).
    assert!(served.into_inner() >= 8 * 13);
    // Nothing stays pinned but the shared lease, and the budget held throughout.
    let stats = registry.stats().unwrap();
    assert_eq!(stats.pinned, 1, "{stats:?}");
    assert!(stats.peak_loaded_bytes <= 2 * bytes, "{stats:?}");
    // The last owner of a lease may be another thread.
    std::thread::spawn(move || drop(shared)).join().unwrap();
    assert_eq!(registry.stats().unwrap().pinned, 0);
}

/// The weights an adapter's layers change: (name, shape, values) read from the base model.
fn base_weights(base: &Checkpoint, adapter: &Adapter) -> Vec<(String, Vec<u64>, Vec<f32>)> {
    adapter
        .modules()
        .map(|m| {
            let name = m.tensor_by_role("lora_A.weight").unwrap().base_name().to_string();
            let info = base.tensor_by_name(&name).unwrap();
            (name, info.shape.to_vec(), base.read_as::<f32>(info.index).unwrap())
        })
        .collect()
}

/// The weights after merge_into of `adapter` at `scale` (the library's buffer merge).
fn merged(adapter: &Adapter, weights: &[(String, Vec<u64>, Vec<f32>)], scale: f64) -> Vec<Vec<f32>> {
    let mut options = MergeBufferOptions::new().unwrap();
    options.set_weight(scale).unwrap();
    weights
        .iter()
        .map(|(name, shape, values)| {
            let mut w = values.clone();
            drop(merge_into(adapter, name, Buffer::F32(&mut w), shape, None, Some(&options)).unwrap());
            w
        })
        .collect()
}

#[track_caller]
fn assert_weights(host: &HostModel<'_>, names: &[String], want: &[Vec<f32>], what: &str) {
    for (name, want) in names.iter().zip(want) {
        let Some(BufferRef::F32(got)) = host.weight(name) else { panic!("no F32 weight {name}") };
        assert!(bits(got) == bits(want), "{what}: {name} differs");
    }
}

#[test]
fn host_model_swaps_adapters_and_restores_the_weights_bit_for_bit() {
    let base = Checkpoint::open(fixture(&["models", "llama"])).unwrap();
    let (lora, second) = (open(LORA), open(SECOND));
    let weights = base_weights(&base, &lora);
    let names: Vec<String> = weights.iter().map(|w| w.0.clone()).collect();
    let originals: Vec<Vec<f32>> = weights.iter().map(|w| w.2.clone()).collect();
    let (want_a, want_b, want_half) =
        (merged(&lora, &weights, 1.0), merged(&second, &weights, 1.0), merged(&lora, &weights, 0.5));
    let layers = weights.len() as u64;
    // Exact mode keeps a copy of each weight from its first merge, for the host model's life.
    let weight_bytes: u64 = weights.iter().map(|w| w.2.len() as u64 * 4).sum();

    let registry = registry_with(DType::F32, LOTS, &[("a", LORA), ("b", SECOND)]);
    let mut buffers = originals.clone();
    let mut host = HostModel::new().unwrap();
    for ((name, shape, _), buffer) in weights.iter().zip(buffers.iter_mut()) {
        host.add_weight(name, Buffer::F32(buffer), shape, None).unwrap();
    }
    assert_eq!(host.current(), None);
    assert_weights(&host, &names, &originals, "before any swap");

    let stats = host.swap(Some(&registry.acquire("a").unwrap()), 1.0).unwrap(); // the lease goes at once
    assert_eq!((stats.layers_removed, stats.layers_merged), (0, layers), "{stats:?}");
    assert!(stats.saved_bytes == weight_bytes && stats.merge_seconds >= 0.0, "{stats:?}");
    assert_eq!(host.current(), Some("a"));
    assert_weights(&host, &names, &want_a, "a merged");
    // The host model pins its adapter: trimming keeps it.
    registry.trim().unwrap();
    let stats = registry.stats().unwrap();
    assert_eq!((stats.loaded, stats.pinned), (1, 1), "{stats:?}");

    let stats = host.swap(Some(&registry.acquire("b").unwrap()), 1.0).unwrap();
    assert_eq!((stats.layers_removed, stats.layers_merged), (layers, layers), "{stats:?}");
    assert_eq!(host.current(), Some("b"));
    assert_weights(&host, &names, &want_b, "a swapped for b");

    let stats = host.swap(Some(&registry.acquire("a").unwrap()), 0.5).unwrap();
    assert_eq!((stats.layers_removed, stats.layers_merged), (layers, layers));
    assert_weights(&host, &names, &want_half, "b swapped for a at 0.5");

    let stats = host.swap(None, 1.0).unwrap();
    assert_eq!((stats.layers_removed, stats.layers_merged, stats.saved_bytes), (layers, 0, weight_bytes), "{stats:?}");
    assert_eq!(host.current(), None);
    assert_weights(&host, &names, &originals, "swapped out");
    assert_eq!(registry.stats().unwrap().pinned, 0);

    // Dropping the host model leaves the buffers as they are and gives them back.
    host.swap(Some(&registry.acquire("b").unwrap()), 1.0).unwrap();
    drop(host);
    for (got, want) in buffers.iter().zip(&want_b) {
        assert_eq!(bits(got), bits(want));
    }
    assert_eq!(registry.stats().unwrap().pinned, 0, "the host model's hold went with it");
}

fn buffer_16(dtype: DType, values: &mut [u16]) -> Buffer<'_> {
    if dtype == DType::BF16 {
        Buffer::BF16(values)
    } else {
        Buffer::F16(values)
    }
}

#[test]
fn host_model_in_16_bits_exact_and_arithmetic() {
    let base = Checkpoint::open(fixture(&["models", "llama"])).unwrap();
    let lora = open(LORA);
    let weights = base_weights(&base, &lora);
    let registry = registry_with(DType::F32, LOTS, &[("a", LORA), ("b", SECOND)]);
    for dtype in [DType::BF16, DType::F16] {
        let originals: Vec<Vec<u16>> = weights.iter().map(|w| to_16(dtype, &w.2)).collect();
        // What merge_into makes of the same buffer.
        let want_a: Vec<Vec<u16>> = weights
            .iter()
            .zip(&originals)
            .map(|((name, shape, _), original)| {
                let mut w = original.clone();
                drop(merge_into(&lora, name, buffer_16(dtype, &mut w), shape, None, None).unwrap());
                w
            })
            .collect();
        for exact in [true, false] {
            let mut buffers = originals.clone();
            let mut host = HostModel::new().unwrap();
            host.set_exact(exact).unwrap();
            for ((name, shape, _), buffer) in weights.iter().zip(buffers.iter_mut()) {
                host.add_weight(name, buffer_16(dtype, buffer), shape, None).unwrap();
            }
            let view = |host: &HostModel<'_>, name: &str| match host.weight(name) {
                Some(BufferRef::BF16(v) | BufferRef::F16(v)) => v.to_vec(),
                other => panic!("{name}: {other:?}"),
            };
            // Exact: three rounds of a and b, then none. Arithmetic: a, then none.
            for round in 0..if exact { 3 } else { 1 } {
                let stats = host.swap(Some(&registry.acquire("a").unwrap()), 1.0).unwrap();
                assert_eq!(stats.saved_bytes > 0, exact, "{stats:?}");
                if round == 0 {
                    for ((name, _, _), want) in weights.iter().zip(&want_a) {
                        assert_eq!(&view(&host, name), want, "{dtype} {name}: the swap differs from merge_into");
                    }
                }
                if exact {
                    host.swap(Some(&registry.acquire("b").unwrap()), 1.0).unwrap();
                }
            }
            host.swap(None, 1.0).unwrap();
            drop(host);
            // PEFT's unmerge rounds once more: within half an ulp of the merge and half of the unmerge.
            let ulp = if dtype == DType::BF16 { f32::powi(2.0, -7) } else { f32::powi(2.0, -10) };
            let (mut checked, mut moved) = (0, 0);
            for (((name, _, _), (got, original)), merged) in
                weights.iter().zip(buffers.iter().zip(&originals)).zip(&want_a)
            {
                if exact {
                    assert_eq!(got, original, "{dtype} {name}: not restored bit for bit");
                    continue;
                }
                let (got, original, merged) = (from_16(dtype, got), from_16(dtype, original), from_16(dtype, merged));
                for ((g, w), m) in got.iter().zip(&original).zip(&merged) {
                    let bound = 1.01 * ulp * w.abs().max(m.abs()) + f32::powi(2.0, -24);
                    assert!((g - w).abs() <= bound, "{dtype} {name}: {g} after unmerge, was {w}");
                    checked += 1;
                    moved += usize::from((m - w).abs() > bound);
                }
            }
            // The bound is tight enough that leaving the adapter merged would have failed it.
            assert!(exact || moved * 2 > checked, "{dtype}: the merge moved only {moved} of {checked} elements");
        }
    }
}

#[test]
fn host_model_errors_change_nothing() {
    let base = Checkpoint::open(fixture(&["models", "llama"])).unwrap();
    let lora = open(LORA);
    let weights = base_weights(&base, &lora);
    let registry = registry_with(DType::F32, LOTS, &[("a", LORA), ("tokens", "llama_trainable_tokens")]);
    let a = registry.acquire("a").unwrap();
    let mut late = vec![0f32; 16 * 16];

    // Checked by the binding: the weight holds exactly its shape's elements.
    let (mut short, mut empty, mut nul) = (vec![0f32; 255], Vec::<f32>::new(), vec![0f32; 256]);
    let mut host = HostModel::new().unwrap();
    expect_code(
        host.add_weight("model.layers.0.self_attn.q_proj", Buffer::F32(&mut short), &[16, 16], None),
        ErrorCode::InvalidArgument,
    );
    expect_code(
        host.add_weight("model.layers.0.self_attn.k_proj", Buffer::F32(&mut empty), &[0, 16], None),
        ErrorCode::ShapeMismatch,
    );
    expect_code(host.add_weight("q\0", Buffer::F32(&mut nul), &[16, 16], None), ErrorCode::InvalidArgument);
    drop(host);

    // Only layer 0's weights: an adapter with layer 1 too cannot be merged, and nothing changes.
    let layer0: Vec<_> = weights.iter().filter(|w| w.0.contains(".layers.0.")).cloned().collect();
    let mut buffers: Vec<Vec<f32>> = layer0.iter().map(|w| w.2.clone()).collect();
    let mut twice = layer0[0].2.clone();
    let translator = lora.translator().unwrap();
    let mut host = HostModel::new().unwrap();
    for ((name, shape, _), buffer) in layer0.iter().zip(buffers.iter_mut()) {
        host.add_weight(name, Buffer::F32(buffer), shape, None).unwrap();
    }
    // The same layer again, by its module path.
    let module = layer0[0].0.strip_suffix(".weight").unwrap();
    expect_code(host.add_weight(module, Buffer::F32(&mut twice), &layer0[0].1, None), ErrorCode::InvalidArgument);
    expect_code(host.set_translator(Some(&translator)).map(|_| ()), ErrorCode::InvalidArgument);
    let err = expect_code(host.swap(Some(&a), 1.0), ErrorCode::UnresolvedKey);
    assert!(err.message().contains("layers.1"), "{err}");
    expect_code(host.swap(Some(&a), f64::NAN), ErrorCode::InvalidArgument);
    expect_code(host.swap(Some(&registry.acquire("tokens").unwrap()), 1.0), ErrorCode::Unsupported);
    assert_eq!(host.current(), None);
    for (name, _, original) in &layer0 {
        let Some(BufferRef::F32(got)) = host.weight(name) else { panic!("{name}") };
        assert!(bits(got) == bits(original), "{name}: a failed swap changed it");
    }
    drop(host);

    // Weights cannot be added while an adapter is merged.
    let mut buffers: Vec<Vec<f32>> = weights.iter().map(|w| w.2.clone()).collect();
    let mut host = HostModel::new().unwrap();
    for ((name, shape, _), buffer) in weights.iter().zip(buffers.iter_mut()) {
        host.add_weight(name, Buffer::F32(buffer), shape, None).unwrap();
    }
    host.swap(Some(&a), 1.0).unwrap();
    expect_code(host.add_weight("lm_head.weight", Buffer::F32(&mut late), &[16, 16], None), ErrorCode::InvalidArgument);
    host.swap(None, 1.0).unwrap();
}

/// A layer of a base model with a bias: its weight and its bias.
#[derive(Clone)]
struct BiasedLayer {
    name: String,
    shape: Vec<u64>,
    weight: Vec<f32>,
    bias: Vec<f32>,
}

/// The qwen2 fixture's layers that qwen2_lora_bias adapts (q_proj [16, 16], v_proj [8, 16], each
/// with a bias of its output features), the adapter, and a registry holding it as "bias".
fn lora_bias_layers() -> (Vec<BiasedLayer>, Adapter, Registry) {
    let base_dir = fixture(&["models", "qwen2"]);
    let base = Checkpoint::open(&base_dir).unwrap();
    let adapter = Adapter::open_with_base(adapter_dir("qwen2_lora_bias"), &base_dir).unwrap();
    let mut options = AdapterOptions::new().unwrap();
    options.set_base_dir(Some(&base_dir)).unwrap();
    let registry = Registry::new(DType::F32, LOTS, None).unwrap();
    registry.register("bias", adapter_dir("qwen2_lora_bias"), Some(&options)).unwrap();
    let read = |name: &str| base.read_as::<f32>(base.tensor_by_name(name).unwrap().index).unwrap();
    let layers = adapter
        .modules()
        .map(|m| {
            let name = m.tensor_by_role("lora_A.weight").unwrap().base_name().to_string();
            let shape = base.tensor_by_name(&name).unwrap().shape.to_vec();
            BiasedLayer { weight: read(&name), bias: read(&name.replace(".weight", ".bias")), name, shape }
        })
        .collect();
    (layers, adapter, registry)
}

#[test]
fn host_model_with_lora_bias_changes_the_bias_and_restores_it() {
    let (mut layers, adapter, registry) = lora_bias_layers();
    let lease = registry.acquire("bias").unwrap();
    // What merge_into makes of each layer with its bias.
    let want: Vec<(Vec<f32>, Vec<f32>)> = layers
        .iter()
        .zip(adapter.modules())
        .map(|(layer, module)| {
            let (mut w, mut b) = (layer.weight.clone(), layer.bias.clone());
            let bias = Some(Buffer::F32(&mut b));
            drop(merge_into(&adapter, module.name(), Buffer::F32(&mut w), &layer.shape, bias, None).unwrap());
            (w, b)
        })
        .collect();
    let originals = layers.clone();

    // No bias at all fails at the swap.
    {
        let mut copies: Vec<Vec<f32>> = layers.iter().map(|l| l.weight.clone()).collect();
        let mut host = HostModel::new().unwrap();
        for (layer, w) in layers.iter().zip(copies.iter_mut()) {
            host.add_weight(&layer.name, Buffer::F32(w), &layer.shape, None).unwrap();
        }
        expect_code(host.swap(Some(&lease), 1.0), ErrorCode::InvalidArgument);
    }

    let mut host = HostModel::new().unwrap();
    for layer in layers.iter_mut() {
        let bias = Some(Buffer::F32(&mut layer.bias));
        host.add_weight(&layer.name, Buffer::F32(&mut layer.weight), &layer.shape, bias).unwrap();
    }
    host.swap(Some(&lease), 1.0).unwrap();
    for (layer, (want_w, want_b)) in originals.iter().zip(&want) {
        let name = &layer.name;
        let (Some(BufferRef::F32(w)), Some(BufferRef::F32(b))) = (host.weight(name), host.bias(name)) else {
            panic!("{name}")
        };
        assert!(bits(w) == bits(want_w), "{name}: weight differs from merge_into");
        assert!(bits(b) == bits(want_b), "{name}: bias differs from merge_into");
    }
    host.swap(None, 1.0).unwrap();
    drop(host);
    for (got, original) in layers.iter().zip(&originals) {
        let restored = bits(&got.weight) == bits(&original.weight) && bits(&got.bias) == bits(&original.bias);
        assert!(restored, "{}: not restored", got.name);
    }
}

/// A bias one element shorter or longer than its layer's output features (v_proj: 8) is refused
/// at the swap, naming the layer, with every buffer unchanged; the element past a short bias is
/// not written either. An empty bias is refused when it is given.
#[test]
fn host_model_refuses_a_bias_of_another_length() {
    let (layers, _adapter, registry) = lora_bias_layers();
    let lease = registry.acquire("bias").unwrap();
    let wrong = layers.iter().position(|l| l.name.ends_with("layers.0.self_attn.v_proj.weight")).unwrap();
    assert_eq!(layers[wrong].bias.len(), 8);
    for len in [7, 9] {
        let mut changed = layers.clone();
        // The short bias is the front of a 9-element buffer whose last elements it does not own.
        changed[wrong].bias.resize(9, 0.5);
        let before = changed.clone();
        {
            let mut host = HostModel::new().unwrap();
            for (i, layer) in changed.iter_mut().enumerate() {
                let bias = if i == wrong { &mut layer.bias[..len] } else { &mut layer.bias[..] };
                host.add_weight(&layer.name, Buffer::F32(&mut layer.weight), &layer.shape, Some(Buffer::F32(bias)))
                    .unwrap();
            }
            let error = expect_code(host.swap(Some(&lease), 1.0), ErrorCode::ShapeMismatch);
            assert!(error.message().contains("v_proj"), "the error does not name the layer: {error}");
            assert_eq!(host.current(), None);
        }
        for (got, was) in changed.iter().zip(&before) {
            let same = bits(&got.weight) == bits(&was.weight) && bits(&got.bias) == bits(&was.bias);
            assert!(same, "{}: changed by a refused swap (bias of {len})", got.name);
        }
    }

    let layer = &layers[wrong];
    let (mut w, mut empty) = (layer.weight.clone(), Vec::<f32>::new());
    let mut host = HostModel::new().unwrap();
    let added = host.add_weight(&layer.name, Buffer::F32(&mut w), &layer.shape, Some(Buffer::F32(&mut empty)));
    expect_code(added, ErrorCode::ShapeMismatch);
}

#[test]
fn host_names_through_translators() {
    let base = Checkpoint::open(fixture(&["models", "llama"])).unwrap();
    let lora = open(LORA);
    let translator = lora.translator().unwrap();
    let weights = base_weights(&base, &lora);

    // A host model reading the host's own names merges as one reading HuggingFace names.
    let registry = registry_with(DType::F32, LOTS, &[("a", LORA)]);
    let mut by_hf: Vec<Vec<f32>> = weights.iter().map(|w| w.2.clone()).collect();
    let mut by_native = by_hf.clone();
    let mut unknown = vec![0f32; 4];
    {
        let mut hf = HostModel::new().unwrap();
        let mut native = HostModel::new().unwrap();
        native.set_translator(Some(&translator)).unwrap();
        for ((name, shape, _), (a, b)) in weights.iter().zip(by_hf.iter_mut().zip(by_native.iter_mut())) {
            hf.add_weight(name, Buffer::F32(a), shape, None).unwrap();
            native.add_weight(&translator.to_native(name).unwrap(), Buffer::F32(b), shape, None).unwrap();
        }
        expect_code(
            native.add_weight("no/such/weight", Buffer::F32(&mut unknown), &[2, 2], None),
            ErrorCode::UnresolvedKey,
        );
        let lease = registry.acquire("a").unwrap();
        hf.swap(Some(&lease), 1.0).unwrap();
        native.swap(Some(&lease), 1.0).unwrap();
    }
    assert!(by_hf.iter().zip(&by_native).all(|(a, b)| bits(a) == bits(b)), "native and HF names merged differently");
    assert!(by_hf.iter().zip(&weights).any(|(a, w)| bits(a) != bits(&w.2)), "nothing was merged");

    // A registry with a translator reads lora_apply's layer names as the host's.
    let translated = Registry::new(DType::F32, LOTS, Some(&translator)).unwrap();
    drop(translator); // the registry shares the table
    translated.register("a", adapter_dir(LORA), None).unwrap();
    let (plain, native) = (registry.acquire("a").unwrap(), translated.acquire("a").unwrap());
    let module = "model.layers.1.mlp.gate_proj"; // 16 -> 32
    let native_name = lora.translator().unwrap().to_native(&format!("{module}.weight")).unwrap();
    assert!(native.has_module(&native_name), "{native_name}");
    let x = pseudo_random(2 * 16, 15);
    let y0 = pseudo_random(2 * 32, 16);
    let (mut y1, mut y2) = (y0.clone(), y0.clone());
    lora_apply(module, &[&plain], None, BufferRef::F32(&x), 16, Buffer::F32(&mut y1), 32).unwrap();
    lora_apply(&native_name, &[&native], None, BufferRef::F32(&x), 16, Buffer::F32(&mut y2), 32).unwrap();
    assert_eq!(bits(&y1), bits(&y2));
    assert_ne!(bits(&y1), bits(&y0));
}

#[test]
fn a_host_model_moves_between_threads_with_its_buffers() {
    let base = Checkpoint::open(fixture(&["models", "llama"])).unwrap();
    let lora = open(LORA);
    let weights = base_weights(&base, &lora);
    let want = merged(&lora, &weights, 1.0);
    let registry = registry_with(DType::F32, LOTS, &[("a", LORA)]);
    let mut buffers: Vec<Vec<f32>> = weights.iter().map(|w| w.2.clone()).collect();
    let mut host = HostModel::new().unwrap();
    for ((name, shape, _), buffer) in weights.iter().zip(buffers.iter_mut()) {
        host.add_weight(name, Buffer::F32(buffer), shape, None).unwrap();
    }
    let host = std::thread::scope(|scope| {
        scope
            .spawn(|| {
                host.swap(Some(&registry.acquire("a").unwrap()), 1.0).unwrap();
                host
            })
            .join()
            .unwrap()
    });
    let names: Vec<String> = weights.iter().map(|w| w.0.clone()).collect();
    assert_weights(&host, &names, &want, "swapped in another thread");
    std::thread::scope(|scope| scope.spawn(|| drop(host)).join().unwrap());
    assert!(buffers.iter().zip(&want).all(|(a, b)| bits(a) == bits(b)));
}

/// LoRA on fused MoE experts (`target_parameters`): Mixtral's experts held fused, as transformers 5
/// holds them ([experts, out, in] under the parameter's name), swap in as the buffer merge writes
/// them and out bit for bit; unmerged apply refuses the layers they adapt.
#[test]
fn host_model_swaps_lora_on_fused_experts() {
    const EXPERTS: usize = 2;
    let base = Checkpoint::open(fixture(&["models", "mixtral"])).unwrap();
    let adapter = open("mixtral_target_parameters");
    let mut weights = Vec::new();
    for layer in 0..2 {
        let saved = |e: usize, w: &str| format!("model.layers.{layer}.block_sparse_moe.experts.{e}.{w}.weight");
        for (param, parts) in [("gate_up_proj", &["w1", "w3"][..]), ("down_proj", &["w2"][..])] {
            let (mut shape, mut values) = (vec![EXPERTS as u64, 0, 0], Vec::new());
            for e in 0..EXPERTS {
                shape[1] = 0; // each expert's saved tensors one after another: gate, then up
                for part in parts {
                    let info = base.tensor_by_name(&saved(e, part)).unwrap();
                    shape[1] += info.shape[0];
                    shape[2] = info.shape[1];
                    values.extend(base.read_as::<f32>(info.index).unwrap());
                }
            }
            weights.push((format!("model.layers.{layer}.mlp.experts.{param}"), shape, values));
        }
        let q = format!("model.layers.{layer}.self_attn.q_proj.weight");
        let info = base.tensor_by_name(&q).unwrap();
        weights.push((q, info.shape.to_vec(), base.read_as::<f32>(info.index).unwrap()));
    }
    let names: Vec<String> = weights.iter().map(|w| w.0.clone()).collect();
    let originals: Vec<Vec<f32>> = weights.iter().map(|w| w.2.clone()).collect();
    let want = merged(&adapter, &weights, 1.0);

    let registry = registry_with(DType::F32, LOTS, &[("experts", "mixtral_target_parameters")]);
    let mut buffers = originals.clone();
    let mut host = HostModel::new().unwrap();
    for ((name, shape, _), buffer) in weights.iter().zip(buffers.iter_mut()) {
        host.add_weight(name, Buffer::F32(buffer), shape, None).unwrap();
    }
    let lease = registry.acquire("experts").unwrap();
    let stats = host.swap(Some(&lease), 1.0).unwrap();
    assert_eq!(stats.layers_merged, weights.len() as u64, "{stats:?}");
    assert_weights(&host, &names, &want, "experts merged");
    for (merged, original) in want.iter().zip(&originals) {
        assert!(bits(merged) != bits(original), "the adapter changes every weight given");
    }

    let x = [1.0f32; 16];
    let mut y = [0.0f32; 32];
    let error = expect_code(
        lora_apply(
            "model.layers.0.block_sparse_moe.experts.0.w1",
            &[&lease],
            None,
            BufferRef::F32(&x),
            16,
            Buffer::F32(&mut y),
            32,
        ),
        ErrorCode::Unsupported,
    );
    assert!(error.to_string().contains("target_parameters"), "{error}");

    host.swap(None, 1.0).unwrap();
    assert_weights(&host, &names, &originals, "swapped out");
}
