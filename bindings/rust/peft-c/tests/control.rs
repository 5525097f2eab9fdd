//! Control vectors through the safe crate: building, reading back, saving and reopening in both
//! formats, llama.cpp's f32 arithmetic of `add` and `apply`, the exact removal, and error codes.

mod common;

use common::{expect_code, TempDir};
use peft_c::{Buffer, ControlVector, DType, ErrorCode, FileFormat};

const D1: [f32; 4] = [0.1, -0.25, 1.5, 3.0e-3];
const D3: [f32; 4] = [-1.0, 0.7, 0.0, 2.5];

fn sample() -> ControlVector {
    let mut v = ControlVector::new(4, Some("test-model")).unwrap();
    v.set_direction(1, &D1).unwrap();
    v.set_direction(3, &D3).unwrap();
    v
}

#[test]
fn build_and_read_back() {
    let v = sample();
    assert_eq!(v.n_embd(), 4);
    assert_eq!(v.model_hint(), "test-model");
    assert_eq!(v.layer_count(), 2);
    assert_eq!(v.layer(0), Some(1));
    assert_eq!(v.layer(1), Some(3));
    assert_eq!(v.layer(2), None);
    assert_eq!(v.layers(), vec![1, 3]);
    assert_eq!(v.direction(1).unwrap(), D1);
    assert_eq!(v.direction(3).unwrap(), D3);
    assert_eq!(v.direction(2), None);
    assert_eq!(ControlVector::new(4, None).unwrap().model_hint(), "");

    // The raw form: F64 values converted to f32.
    let mut w = ControlVector::new(4, None).unwrap();
    let values: Vec<u8> = [0.5f64, -2.0, 1.0e-3, 8.0].iter().flat_map(|x| x.to_le_bytes()).collect();
    w.set_direction_raw(5, DType::F64, &values).unwrap();
    assert_eq!(w.direction(5).unwrap(), [0.5f32, -2.0, 1.0e-3, 8.0]);
    expect_code(w.set_direction_raw(5, DType::F64, &values[..8]), ErrorCode::InvalidArgument);
}

#[test]
fn save_and_open_both_formats() {
    let dir = TempDir::new("control");
    let v = sample();
    for (name, format) in [("cv.gguf", FileFormat::Gguf), ("cv.safetensors", FileFormat::Safetensors)] {
        let path = dir.join(name);
        v.save(&path, format).unwrap();
        let back = ControlVector::open(&path).unwrap();
        assert_eq!(back.n_embd(), 4, "{name}");
        assert_eq!(back.model_hint(), "test-model", "{name}");
        assert_eq!(back.layers(), vec![1, 3], "{name}");
        assert_eq!(back.direction(1).unwrap(), D1, "{name}");
        assert_eq!(back.direction(3).unwrap(), D3, "{name}");
    }
}

#[test]
fn add_is_f32_arithmetic() {
    let mut dst = sample();
    let mut src = ControlVector::new(4, None).unwrap();
    let s3 = [0.3f32, 0.1, -7.0, 1.0e-7];
    let s4 = [1.0f32, 2.0, 3.0, 4.0];
    src.set_direction(3, &s3).unwrap();
    src.set_direction(4, &s4).unwrap();
    dst.add(&src, 0.5).unwrap();
    assert_eq!(dst.layers(), vec![1, 3, 4]);
    assert_eq!(dst.direction(1).unwrap(), D1);
    let want3: Vec<f32> = D3.iter().zip(s3).map(|(d, s)| d + s * 0.5f32).collect();
    let want4: Vec<f32> = s4.iter().map(|s| 0.0f32 + s * 0.5f32).collect();
    assert_eq!(dst.direction(3).unwrap(), want3);
    assert_eq!(dst.direction(4).unwrap(), want4);

    let other = ControlVector::new(5, None).unwrap();
    expect_code(dst.add(&other, 1.0), ErrorCode::ShapeMismatch);
}

#[test]
fn apply_and_remove_exactly() {
    let v = sample();
    let original: Vec<f32> = vec![1.0, 2.0, -3.0, 0.125, 10.0, -0.5, 0.333, 7.0];
    let mut buf = original.clone();
    let mut record = v.apply(3, 2.0, Buffer::F32(&mut buf)).unwrap();
    let want: Vec<f32> = original.iter().enumerate().map(|(i, x)| x + D3[i % 4] * 2.0f32).collect();
    assert_eq!(buf, want);
    record.remove(Buffer::F32(&mut buf)).unwrap();
    assert_eq!(
        buf.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
        original.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
    );
    // The record is spent.
    expect_code(record.remove(Buffer::F32(&mut buf)), ErrorCode::InvalidArgument);

    // Without a record.
    v.apply_without_record(1, 2.0, Buffer::F32(&mut buf)).unwrap();
    let want: Vec<f32> = original.iter().enumerate().map(|(i, x)| x + D1[i % 4] * 2.0f32).collect();
    assert_eq!(buf, want);

    // A layer without a direction leaves the buffer as it is.
    let mut buf = original.clone();
    let mut record = v.apply(2, 2.0, Buffer::F32(&mut buf)).unwrap();
    assert_eq!(buf, original);
    record.remove(Buffer::F32(&mut buf)).unwrap();
    assert_eq!(buf, original);

    // A buffer of other than whole rows is refused before the call.
    let mut short = vec![0f32; 6];
    expect_code(v.apply(3, 1.0, Buffer::F32(&mut short)), ErrorCode::InvalidArgument);
}

#[test]
fn errors_map_to_codes() {
    let dir = TempDir::new("control-errors");
    let mut v = sample();
    v.set_direction(0, &D1).unwrap();
    expect_code(v.save(dir.join("zero.gguf"), FileFormat::Gguf), ErrorCode::InvalidArgument);
    v.save(dir.join("zero.safetensors"), FileFormat::Safetensors).unwrap();
    expect_code(ControlVector::open(dir.join("missing.gguf")), ErrorCode::Io);
    expect_code(v.set_direction(2, &[1.0, f32::NAN, 0.0, 0.0]), ErrorCode::NonFinite);
    expect_code(v.set_direction(-1, &D1), ErrorCode::InvalidArgument);
    expect_code(ControlVector::new(0, None), ErrorCode::InvalidArgument);
}
