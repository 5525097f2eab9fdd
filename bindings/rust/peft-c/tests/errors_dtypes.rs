//! Error codes, versions, dtypes and conversions (against torch's tables in tests/fixtures/dtype).

mod common;

use common::{expect_code, fixture, sha256_hex};
use peft_c::{convert, sys, Checkpoint, DType, Error, ErrorCode};

#[test]
fn sha256_of_test_support_is_right() {
    assert_eq!(sha256_hex(b""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    assert_eq!(sha256_hex(b"abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    assert_eq!(
        sha256_hex(b"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
        "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"
    );
}

#[test]
fn kernel_table_is_named() {
    let kernels = peft_c::kernels();
    assert!(["portable", "avx2", "avx512"].contains(&kernels), "kernel table {kernels}");
    if std::env::var("PEFT_C_KERNELS").as_deref() == Ok("portable") {
        assert_eq!(kernels, "portable");
    }
}

#[test]
fn versions_match_the_header() {
    assert_eq!(peft_c::abi_version(), peft_c::HEADER_ABI_VERSION);
    let (major, minor, patch) = peft_c::HEADER_VERSION;
    assert_eq!(peft_c::version_number(), major * 10000 + minor * 100 + patch);
    assert_eq!(peft_c::version(), format!("{major}.{minor}.{patch}"));
}

#[test]
fn error_codes_round_trip_and_have_the_library_names() {
    let mut names = std::collections::BTreeSet::new();
    for code in ErrorCode::ALL {
        assert_eq!(ErrorCode::from_raw(code.raw()), code);
        assert_ne!(code.name(), "UNKNOWN", "{code:?}");
        assert!(names.insert(code.name()), "{} twice", code.name());
    }
    // The names are the header's constant names without the prefix.
    assert_eq!(ErrorCode::InvalidOffset.name(), "INVALID_OFFSET");
    assert_eq!(ErrorCode::InvalidOffset.raw(), sys::PEFT_ERR_INVALID_OFFSET);
    assert_eq!(ErrorCode::MetadataIncompleteBuffer.raw(), 10);
    assert_eq!(ErrorCode::Internal.raw(), 99);
    assert_eq!(ErrorCode::from_raw(12345), ErrorCode::Unknown(12345));
    assert_eq!(ErrorCode::Unknown(12345).name(), "UNKNOWN");
    assert_eq!(ErrorCode::Unknown(12345).raw(), 12345);
}

#[test]
fn errors_carry_code_and_message() {
    let missing = fixture(&["safetensors", "no_such_file.safetensors"]);
    let err = expect_code(Checkpoint::open(&missing), ErrorCode::Io);
    assert!(err.message().contains("no_such_file.safetensors"), "{err}");
    assert_eq!(err.to_string(), format!("IO: {}", err.message()));
    let boxed: Box<dyn std::error::Error + Send + Sync> = Box::new(err.clone());
    assert_eq!(boxed.to_string(), err.to_string());
    let own = Error::new(ErrorCode::NotFound, "x");
    assert_eq!((own.code(), own.message()), (ErrorCode::NotFound, "x"));
}

#[test]
fn dtype_names_bits_and_values() {
    let expected = [
        ("BOOL", 8),
        ("F4", 4),
        ("F6_E2M3", 6),
        ("F6_E3M2", 6),
        ("U8", 8),
        ("I8", 8),
        ("F8_E5M2", 8),
        ("F8_E4M3", 8),
        ("F8_E8M0", 8),
        ("F8_E4M3FNUZ", 8),
        ("F8_E5M2FNUZ", 8),
        ("I16", 16),
        ("U16", 16),
        ("F16", 16),
        ("BF16", 16),
        ("I32", 32),
        ("U32", 32),
        ("F32", 32),
        ("C64", 64),
        ("F64", 64),
        ("I64", 64),
        ("U64", 64),
    ];
    assert_eq!(DType::ALL.len(), expected.len());
    for (i, (dtype, (name, bits))) in DType::ALL.into_iter().zip(expected).enumerate() {
        assert_eq!(dtype.raw(), i as i32);
        assert_eq!(DType::from_raw(i as i32), Some(dtype));
        assert_eq!(dtype.name(), name);
        assert_eq!(dtype.to_string(), name);
        assert_eq!(DType::from_name(name), Some(dtype));
        assert_eq!(name.parse::<DType>().unwrap(), dtype);
        assert_eq!(dtype.bits(), bits);
    }
    assert_eq!(DType::from_raw(-1), None);
    assert_eq!(DType::from_raw(sys::PEFT_DTYPE_COUNT), None);
    assert_eq!(DType::from_name("f32"), None); // case-sensitive, as the reference
    assert_eq!(DType::from_name("F32\0"), None);
    expect_code("float32".parse::<DType>(), ErrorCode::InvalidArgument);
    assert_eq!(DType::F4.bytes_for(3), None);
    assert_eq!(DType::F4.bytes_for(4), Some(2));
    assert_eq!(DType::F6E2M3.elements_in(3), Some(4));
    assert_eq!(DType::F32.elements_in(6), None);
    assert_eq!(DType::U64.bytes_for(u64::MAX), None);
}

fn read_fixture(name: &str) -> Vec<u8> {
    std::fs::read(fixture(&["dtype", name])).unwrap()
}

fn u16s(bytes: &[u8]) -> Vec<u16> {
    bytes.chunks_exact(2).map(|c| u16::from_le_bytes([c[0], c[1]])).collect()
}

/// Same bits, or both NaN (torch's NaN bits are not stable).
fn same_f32(got: u32, want: u32) -> bool {
    got == want || (f32::from_bits(got).is_nan() && f32::from_bits(want).is_nan())
}

fn is_nan16(dtype: DType, bits: u16) -> bool {
    match dtype {
        DType::BF16 => bits & 0x7f80 == 0x7f80 && bits & 0x7f != 0,
        _ => bits & 0x7c00 == 0x7c00 && bits & 0x3ff != 0,
    }
}

#[test]
fn widening_conversions_match_torch() {
    let tables = [
        (DType::BF16, "bf16_to_f32.bin", 2usize),
        (DType::F16, "f16_to_f32.bin", 2),
        (DType::F8E4M3, "f8_e4m3_to_f32.bin", 1),
        (DType::F8E5M2, "f8_e5m2_to_f32.bin", 1),
    ];
    for (dtype, table, width) in tables {
        let want = read_fixture(table);
        let count = want.len() / 4;
        let src: Vec<u8> = (0..count).flat_map(|i| (i as u16).to_le_bytes()[..width].to_vec()).collect();
        let mut got = vec![0u8; want.len()];
        assert_eq!(convert(dtype, &src, DType::F32, &mut got).unwrap(), count as u64);
        for (i, (g, w)) in got.chunks_exact(4).zip(want.chunks_exact(4)).enumerate() {
            let (g, w) = (u32::from_le_bytes(g.try_into().unwrap()), u32::from_le_bytes(w.try_into().unwrap()));
            assert!(same_f32(g, w), "{dtype} pattern {i:#x}: {g:#x}, torch {w:#x}");
        }
    }
}

#[test]
fn narrowing_conversions_match_torch() {
    let samples = read_fixture("f32_samples.bin");
    for (dtype, table) in [(DType::BF16, "f32_to_bf16.bin"), (DType::F16, "f32_to_f16.bin")] {
        let want = u16s(&read_fixture(table));
        let mut got = vec![0u8; samples.len() / 2];
        convert(DType::F32, &samples, dtype, &mut got).unwrap();
        for (i, (g, w)) in u16s(&got).into_iter().zip(want).enumerate() {
            assert!(
                g == w || (is_nan16(dtype, g) && is_nan16(dtype, w)),
                "f32 sample {i} -> {dtype}: {g:#x}, torch {w:#x}"
            );
        }
    }
    let samples = read_fixture("f64_samples.bin");
    let want = read_fixture("f64_to_f32.bin");
    let mut got = vec![0u8; samples.len() / 2];
    convert(DType::F64, &samples, DType::F32, &mut got).unwrap();
    for (i, (g, w)) in got.chunks_exact(4).zip(want.chunks_exact(4)).enumerate() {
        let (g, w) = (u32::from_le_bytes(g.try_into().unwrap()), u32::from_le_bytes(w.try_into().unwrap()));
        assert!(same_f32(g, w), "f64 sample {i} -> F32: {g:#x}, torch {w:#x}");
    }
    let samples = read_fixture("i64_samples.bin");
    let want = read_fixture("i64_to_f64.bin");
    let mut got = vec![0u8; samples.len()];
    convert(DType::I64, &samples, DType::F64, &mut got).unwrap();
    assert!(got == want, "I64 -> F64 differs from torch");
}

#[test]
fn conversion_errors() {
    let mut dst = [0u8; 8];
    // Lengths that do not match: caught before the library is called.
    expect_code(convert(DType::F32, &[0u8; 6], DType::F64, &mut dst), ErrorCode::InvalidArgument);
    expect_code(convert(DType::F32, &[0u8; 8], DType::F64, &mut dst), ErrorCode::InvalidArgument);
    // A pair the library does not convert.
    expect_code(convert(DType::F32, &[0u8; 8], DType::I32, &mut dst), ErrorCode::Unsupported);
    // Same-dtype copies of any dtype, sub-byte ones in whole bytes.
    let src = [1u8, 2, 3];
    let mut copy = [0u8; 3];
    assert_eq!(convert(DType::F6E2M3, &src, DType::F6E2M3, &mut copy).unwrap(), 4);
    assert_eq!(copy, src);
    assert_eq!(convert(DType::F32, &[], DType::BF16, &mut []).unwrap(), 0);
}
