//! Writing: byte-identical reproduction of every reference-written fixture (each tensor streamed
//! a different way), of transformers' sharded folder, conversion while writing, argument errors,
//! cancellation by a failing or panicking source, and discarding an unfinished writer.

mod common;

use std::path::Path;

use common::{expect_code, fixture, read_json, TempDir};
use peft_c::{Checkpoint, DType, ErrorCode, Writer};

/// Fixture files the reference writer wrote (the others have hand-made headers).
fn reference_written() -> Vec<String> {
    let hand_made = [
        "padded_header",
        "pretty_header",
        "unordered_header",
        "escapes_in_header",
        "unknown_fields",
        "metadata_null",
        "metadata_empty",
        "metadata_dup_inner",
        "big_numbers",
    ];
    let index = read_json(&fixture(&["safetensors", "INDEX.json"]));
    index
        .as_object()
        .unwrap()
        .keys()
        .filter(|k| !k.ends_with('/') && !hand_made.contains(&k.as_str()))
        .cloned()
        .collect()
}

fn no_temporaries(dir: &Path) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let name = entry.unwrap().file_name();
        assert!(!name.to_string_lossy().contains("peft-tmp"), "temporary {name:?} left behind");
    }
}

/// Declares every tensor of `ckpt` and writes each, choosing a different way of streaming per
/// tensor: from the checkpoint, a buffer, small chunks, a closure.
fn rewrite(ckpt: &Checkpoint, writer: &mut Writer) {
    for t in ckpt.tensors() {
        writer.add_tensor(t.name, t.dtype.unwrap(), t.shape).unwrap();
    }
    writer.start().unwrap();
    let order = writer.order();
    assert_eq!(order.len(), ckpt.len());
    assert_eq!(writer.tensor_count(), ckpt.len());
    for (position, name) in order.iter().enumerate() {
        let info = ckpt.tensor_by_name(name).unwrap();
        assert_eq!(writer.tensor_declaration(position), Some(info.index), "declaration index of {name:?}");
        assert_eq!(writer.tensor_name(position), Some(name.as_str()));
        let view = ckpt.view(info.index).unwrap();
        match position % 4 {
            0 => writer.write_from_checkpoint(name, ckpt, info.index).unwrap(),
            1 => writer.write_tensor(name, info.dtype.unwrap(), view).unwrap(),
            2 => {
                writer.begin_tensor(name, info.dtype.unwrap()).unwrap();
                for chunk in view.chunks(3) {
                    writer.write(chunk).unwrap();
                }
            }
            _ => {
                let mut next = 0u64;
                writer
                    .write_from_fn(name, info.dtype.unwrap(), |offset, dst| {
                        assert_eq!(offset, next, "chunks are contiguous");
                        let start = offset as usize;
                        dst.copy_from_slice(&view[start..start + dst.len()]);
                        next += dst.len() as u64;
                        Ok(())
                    })
                    .unwrap();
            }
        }
    }
    assert_eq!(writer.tensor_name(order.len()), None);
    assert_eq!(writer.tensor_declaration(order.len()), None);
}

#[test]
fn writer_reproduces_reference_files() {
    let tmp = TempDir::new("writer-reference");
    let mut checked = 0;
    for case in reference_written() {
        let src = fixture(&["safetensors", &format!("{case}.safetensors")]);
        let ckpt = Checkpoint::open(&src).unwrap();
        let out = tmp.join(&format!("{case}.safetensors"));
        let mut writer = Writer::new(&out).unwrap();
        if ckpt.has_metadata(0) {
            writer.set_metadata_present(true).unwrap();
        }
        for (key, value) in ckpt.metadata(0) {
            writer.set_metadata(key, value).unwrap();
        }
        rewrite(&ckpt, &mut writer);
        assert_eq!(writer.file_count(), 1);
        assert_eq!(writer.file_path(0), Some(out.as_path()));
        writer.finish().unwrap();
        assert!(std::fs::read(&out).unwrap() == std::fs::read(&src).unwrap(), "{case}: differs from the reference");
        checked += 1;
    }
    assert!(checked >= 30, "only {checked} files compared");
    assert!(reference_written().iter().any(|c| c == "escaped_names"), "the NUL-name case is compared");
    no_temporaries(tmp.path());
}

#[test]
fn checkpoint_writer_reproduces_transformers_shards() {
    let src = fixture(&["safetensors", "sharded"]);
    let ckpt = Checkpoint::open(&src).unwrap();
    let tmp = TempDir::new("writer-shards");
    let out = tmp.join("out");
    let mut writer = Writer::checkpoint(&out, 0).unwrap();
    let tensors: Vec<_> = ckpt.tensors().collect();
    for (i, t) in tensors.iter().enumerate() {
        if i > 0 && t.file != tensors[i - 1].file {
            writer.break_shard().unwrap();
        }
        writer.add_tensor(t.name, t.dtype.unwrap(), t.shape).unwrap();
    }
    if let Some(json) = ckpt.index_metadata_json() {
        writer.set_index_metadata_json(json).unwrap();
    }
    writer.start().unwrap();
    assert_eq!(writer.file_count(), ckpt.file_count());
    for name in writer.order() {
        let index = ckpt.find(&name).unwrap();
        writer.write_from_checkpoint(&name, &ckpt, index).unwrap();
    }
    writer.finish().unwrap();
    for file in 0..ckpt.file_count() {
        let original = ckpt.file_path(file).unwrap();
        let written = out.join(original.file_name().unwrap());
        assert!(std::fs::read(&written).unwrap() == std::fs::read(original).unwrap(), "{}", written.display());
    }
    let index = "model.safetensors.index.json";
    assert_eq!(std::fs::read(out.join(index)).unwrap(), std::fs::read(src.join(index)).unwrap());
}

#[test]
fn writer_converts_while_writing() {
    let values = [1.0f32, -2.5, 1.234567, 65519.0, 1e-8, 0.0];
    let tmp = TempDir::new("writer-convert");
    let path = tmp.join("bf16.safetensors");
    let mut writer = Writer::new(&path).unwrap();
    writer.add_tensor("w", DType::BF16, &[2, 3]).unwrap();
    writer.add_tensor("i", DType::I32, &[2]).unwrap();
    writer.start().unwrap();
    assert_eq!(writer.order(), ["i", "w"]); // widest dtype first, as the reference orders them
    writer.write_tensor_as("i", &[7i32, -9]).unwrap();
    writer.write_tensor_as("w", &values).unwrap();
    writer.finish().unwrap();
    let ckpt = Checkpoint::open(&path).unwrap();
    let raw: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    let mut want = vec![0u8; 12];
    peft_c::convert(DType::F32, &raw, DType::BF16, &mut want).unwrap();
    let w = ckpt.tensor_by_name("w").unwrap();
    assert_eq!((w.dtype, w.shape), (Some(DType::BF16), &[2u64, 3][..]));
    assert_eq!(ckpt.view(w.index).unwrap(), want.as_slice());
    assert_eq!(ckpt.view_as::<i32>(ckpt.find("i").unwrap()).unwrap(), [7, -9]);
    assert!(!ckpt.has_metadata(0), "metadata on a file written without");
}

#[test]
fn writer_argument_errors_change_nothing() {
    let tmp = TempDir::new("writer-errors");
    let path = tmp.join("e.safetensors");
    let mut w = Writer::new(&path).unwrap();
    expect_code(w.add_tensor("__metadata__", DType::F32, &[1]), ErrorCode::InvalidArgument);
    expect_code(w.add_tensor("odd", DType::F4, &[3]), ErrorCode::MisalignedSlice);
    expect_code(w.add_tensor("huge", DType::F64, &[1 << 62, 1 << 3]), ErrorCode::ValidationOverflow);
    expect_code(w.break_shard(), ErrorCode::InvalidArgument); // not a checkpoint writer
    expect_code(w.set_index_metadata_json("{}"), ErrorCode::InvalidArgument);
    assert_eq!(w.tensor_name(0), None); // not started
    w.add_tensor("a", DType::F32, &[2]).unwrap();
    w.add_tensor("b", DType::F32, &[2]).unwrap();
    expect_code(w.add_tensor("a", DType::F32, &[2]), ErrorCode::InvalidArgument); // duplicate
    w.set_metadata("k", "v").unwrap();
    let eight = [0u8; 8];
    expect_code(w.write_tensor("b", DType::F32, &eight), ErrorCode::InvalidArgument); // not next
    expect_code(w.write_tensor("a", DType::F32, &eight[..4]), ErrorCode::TensorInvalidInfo);
    w.write_tensor("a", DType::F32, &eight).unwrap(); // the failed calls changed nothing
    expect_code(w.add_tensor("c", DType::F32, &[2]), ErrorCode::InvalidArgument); // started
    expect_code(w.set_metadata("k2", "v"), ErrorCode::InvalidArgument); // started
    expect_code(w.write(&eight), ErrorCode::InvalidArgument); // no begun tensor
    expect_code(w.finish(), ErrorCode::InvalidArgument); // b is missing; the writer stays usable
    w.begin_tensor("b", DType::F32).unwrap();
    expect_code(w.write(&[0u8; 12]), ErrorCode::InvalidArgument); // more than the tensor has
    assert!(!path.exists(), "the file exists before finish");
    w.write(&eight).unwrap();
    w.finish().unwrap();
    let ckpt = Checkpoint::open(&path).unwrap();
    assert_eq!((ckpt.len(), ckpt.metadata(0)), (2, vec![("k", "v")]));

    expect_code(Writer::new(""), ErrorCode::InvalidArgument);
    expect_code(Writer::checkpoint("", 0), ErrorCode::InvalidArgument);
    expect_code(Writer::new("x\0"), ErrorCode::InvalidArgument);
}

#[test]
fn failing_source_cancels_and_keeps_the_old_file() {
    let tmp = TempDir::new("writer-cancel");
    let path = tmp.join("c.safetensors");
    std::fs::write(&path, b"old content").unwrap();
    let mut w = Writer::new(&path).unwrap();
    w.add_tensor("big", DType::F32, &[3 << 20]).unwrap(); // 12 MiB: several chunks
    let mut calls = 0;
    let err = expect_code(
        w.write_from_fn("big", DType::F32, |_, _| {
            calls += 1;
            if calls == 2 {
                Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "source ran dry"))
            } else {
                Ok(())
            }
        }),
        ErrorCode::Cancelled,
    );
    assert_eq!(calls, 2, "the closure ran again after it failed");
    assert!(err.message().contains("source ran dry"), "{err}");
    // The output is discarded: every later call fails.
    expect_code(w.write_tensor("big", DType::F32, &vec![0u8; 12 << 20]), ErrorCode::InvalidArgument);
    drop(w);
    assert_eq!(std::fs::read(&path).unwrap(), b"old content");
    no_temporaries(tmp.path());
}

#[test]
fn panicking_source_is_resumed_after_the_library_returns() {
    let tmp = TempDir::new("writer-panic");
    let path = tmp.join("p.safetensors");
    let mut w = Writer::new(&path).unwrap();
    w.add_tensor("x", DType::F32, &[4]).unwrap();
    let payload = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let _ = w.write_from_fn("x", DType::F32, |_, _| panic!("boom"));
    }))
    .expect_err("the panic was swallowed");
    assert_eq!(payload.downcast_ref::<&str>(), Some(&"boom"));
    expect_code(w.finish(), ErrorCode::InvalidArgument);
    drop(w);
    assert!(!path.exists(), "a file was written");
    no_temporaries(tmp.path());
}

#[test]
fn dropping_an_unfinished_writer_discards_it() {
    let tmp = TempDir::new("writer-drop");
    let out = tmp.join("ckpt");
    let mut w = Writer::checkpoint(&out, 16).unwrap();
    for name in ["a", "b", "c"] {
        w.add_tensor(name, DType::F32, &[4]).unwrap();
    }
    w.start().unwrap();
    assert_eq!(w.file_count(), 3);
    assert!(w.file_path(0).unwrap().starts_with(&out));
    let first = w.order()[0].clone();
    w.write_tensor(&first, DType::F32, &[0u8; 16]).unwrap();
    drop(w);
    assert!(!out.join("model.safetensors.index.json").exists(), "an index was written");
    if out.exists() {
        no_temporaries(&out);
        assert!(common::list_files(&out).is_empty(), "{:?}", common::list_files(&out));
    }
}

/// Names holding NUL bytes are declared with their length and written as "the next tensor" after
/// the binding checked the name against the writer's order.
#[test]
fn names_with_nul_bytes_are_written_in_order() {
    let tmp = TempDir::new("writer-nul");
    let path = tmp.join("nul.safetensors");
    let mut w = Writer::new(&path).unwrap();
    let (a, b) = ("a\0first", "b\0second");
    w.add_tensor(a, DType::F32, &[1]).unwrap();
    w.add_tensor(b, DType::F32, &[1]).unwrap();
    w.start().unwrap();
    assert_eq!(w.order(), [a, b]);
    expect_code(w.write_tensor(b, DType::F32, &[0u8; 4]), ErrorCode::InvalidArgument); // not next
    expect_code(w.write_tensor("a", DType::F32, &[0u8; 4]), ErrorCode::InvalidArgument); // a prefix only
    w.write_tensor_as(a, &[1.5f32]).unwrap();
    w.begin_tensor(b, DType::F32).unwrap();
    w.write(&2.5f32.to_le_bytes()).unwrap();
    expect_code(w.write_tensor(b, DType::F32, &[0u8; 4]), ErrorCode::InvalidArgument); // all begun
    w.finish().unwrap();
    let ckpt = Checkpoint::open(&path).unwrap();
    assert_eq!(ckpt.read_as::<f32>(ckpt.find(a).unwrap()).unwrap(), [1.5]);
    assert_eq!(ckpt.read_as::<f32>(ckpt.find(b).unwrap()).unwrap(), [2.5]);
}
