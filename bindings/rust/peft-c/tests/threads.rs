//! Read-only handles used from many threads at once, and the marker traits that allow it.

mod common;

use std::sync::Arc;

use common::{fixture, sha256_hex};
use peft_c::{Adapter, Checkpoint, DType, OpenOptions, Translator};

fn send_sync<T: Send + Sync>() {}
fn send<T: Send>() {}

#[test]
fn marker_traits_follow_the_header() {
    send_sync::<Checkpoint>();
    send_sync::<Adapter>();
    send_sync::<Translator>();
    send_sync::<peft_c::MergeResult>();
    send_sync::<peft_c::Error>();
    // One thread at a time (that they are not Sync is checked by compile_fail doctests in lib.rs).
    send::<peft_c::Writer>();
    send::<peft_c::OpenOptions>();
    send::<peft_c::AdapterOptions>();
    send::<peft_c::MergeOptions>();
    send::<peft_c::MergeBufferOptions>();
    send::<peft_c::MergeRecord>();
    send::<peft_c::ExportOptions>();
}

/// Every thread views and reads every tensor and must see what one thread saw.
fn hammer(ckpt: &Checkpoint) {
    let expected: Vec<(String, Vec<f32>)> = ckpt
        .tensors()
        .map(|t| (sha256_hex(ckpt.view(t.index).unwrap()), ckpt.read_as::<f32>(t.index).unwrap()))
        .collect();
    std::thread::scope(|scope| {
        for thread in 0..8 {
            let expected = &expected;
            scope.spawn(move || {
                for round in 0..20 {
                    // Different threads walk the tensors in different orders.
                    for k in 0..ckpt.len() {
                        let i = (k * (thread + 1) + round) % ckpt.len();
                        let info = ckpt.tensor(i).unwrap();
                        assert_eq!(sha256_hex(ckpt.view(i).unwrap()), expected[i].0, "{}", info.name);
                        let values = ckpt.read_as::<f32>(i).unwrap();
                        assert!(values == expected[i].1, "{}", info.name);
                        assert_eq!(ckpt.find(info.name).unwrap(), i);
                    }
                }
            });
        }
    });
}

#[test]
fn checkpoint_is_shared_across_threads() {
    let dir = fixture(&["safetensors", "sharded"]);
    hammer(&Checkpoint::open(&dir).unwrap());
    // With pread, the first view of a tensor reads it: threads race to do so.
    let mut pread = OpenOptions::new().unwrap();
    pread.set_use_pread(true).unwrap();
    hammer(&Checkpoint::open_with(&dir, &pread).unwrap());
}

#[test]
fn checkpoint_moves_to_another_thread_and_views_stay_valid_there() {
    let ckpt = Arc::new(Checkpoint::open(fixture(&["models", "llama", "model.safetensors"])).unwrap());
    let handles: Vec<_> = (0..4)
        .map(|_| {
            let ckpt = Arc::clone(&ckpt);
            std::thread::spawn(move || ckpt.tensors().map(|t| ckpt.view(t.index).unwrap().len()).sum::<usize>())
        })
        .collect();
    let sizes: Vec<usize> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    assert!(sizes.windows(2).all(|w| w[0] == w[1]) && sizes[0] > 0);
    // The last owner may be another thread: it frees the checkpoint there.
    let owned = Checkpoint::open(fixture(&["models", "llama", "model.safetensors"])).unwrap();
    std::thread::spawn(move || drop(owned)).join().unwrap();
}

#[test]
fn adapter_and_translator_are_shared_across_threads() {
    let adapter = Adapter::open_with_base(fixture(&["adapters", "llama_lora"]), fixture(&["models", "llama"])).unwrap();
    let translator = adapter.translator().unwrap();
    let expected: Vec<(String, Vec<u8>, String)> = adapter
        .modules()
        .flat_map(|m| m.tensors().collect::<Vec<_>>())
        .map(|t| (t.key().to_string(), t.read(DType::BF16).unwrap(), translator.to_native(t.key()).unwrap()))
        .collect();
    std::thread::scope(|scope| {
        for _ in 0..8 {
            scope.spawn(|| {
                for _ in 0..20 {
                    let mut k = 0;
                    for module in adapter.modules() {
                        assert_eq!(adapter.find_module(module.name()).unwrap().index(), module.index());
                        for t in module.tensors() {
                            let (key, bytes, native) = &expected[k];
                            assert_eq!(t.key(), key);
                            assert!(&t.read(DType::BF16).unwrap() == bytes, "{key}");
                            assert_eq!(&translator.to_native(key).unwrap(), native);
                            assert_eq!(&translator.to_hf(native, true).unwrap(), key);
                            k += 1;
                        }
                    }
                    adapter.validate(fixture(&["models", "llama"])).unwrap();
                }
            });
        }
    });
}

/// Handles that belong to one thread at a time may move to another thread and be used there.
#[test]
fn writer_and_options_move_between_threads() {
    let tmp = common::TempDir::new("threads-move");
    let path = tmp.join("moved.safetensors");
    let mut writer = peft_c::Writer::new(&path).unwrap();
    writer.add_tensor("x", DType::F32, &[2]).unwrap();
    let writer = std::thread::spawn(move || {
        writer.write_tensor_as("x", &[1.0f32, 2.0]).unwrap();
        writer
    })
    .join()
    .unwrap();
    std::thread::spawn(move || {
        let mut writer = writer;
        writer.finish().unwrap();
    })
    .join()
    .unwrap();
    let ckpt = Checkpoint::open(&path).unwrap();
    assert_eq!(ckpt.read_as::<f32>(0).unwrap(), [1.0, 2.0]);

    let mut options = peft_c::MergeOptions::new().unwrap();
    options.add_adapter_dir(fixture(&["adapters", "llama_lora"]), 1.0).unwrap();
    let out = tmp.join("merged");
    let result = std::thread::spawn(move || peft_c::merge_checkpoint(fixture(&["models", "llama"]), out, &options))
        .join()
        .unwrap()
        .unwrap();
    // The result is Sync: read it from several threads.
    std::thread::scope(|scope| {
        for _ in 0..4 {
            scope.spawn(|| assert!(result.merged() > 0 && !result.files().is_empty()));
        }
    });
}
