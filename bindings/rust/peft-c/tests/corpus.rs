//! Real adapters and checkpoints people published (../shared/corpus/real, or `PEFT_CORPUS`): every
//! safetensors file opens and reads, every adapter opens and round-trips through an export with
//! the same modules and tensor bytes. Skipped, saying so, where the corpus is absent.

mod common;

use std::path::{Path, PathBuf};

use common::TempDir;
use peft_c::{Adapter, Checkpoint};

fn corpus() -> Option<PathBuf> {
    let dir = match std::env::var_os("PEFT_CORPUS") {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../../shared/corpus/real"),
    };
    if dir.join("MANIFEST.md").exists() {
        Some(dir)
    } else {
        eprintln!("skipped: no real-world corpus at {} (set PEFT_CORPUS)", dir.display());
        None
    }
}

fn find(dir: &Path, name_matches: &dyn Fn(&str) -> bool, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            find(&path, name_matches, out);
        } else if name_matches(&path.file_name().unwrap().to_string_lossy()) {
            out.push(path);
        }
    }
    out.sort();
}

#[test]
fn every_real_file_opens_and_reads() {
    let Some(root) = corpus() else { return };
    let mut files = Vec::new();
    find(&root, &|n: &str| n.ends_with(".safetensors"), &mut files);
    assert!(files.len() >= 10, "only {} files", files.len());
    for path in files {
        let ckpt = Checkpoint::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        for t in ckpt.tensors() {
            assert_eq!(ckpt.view(t.index).unwrap().len() as u64, t.nbytes(), "{}: {}", path.display(), t.name);
            ckpt.read_as::<f32>(t.index).unwrap_or_else(|e| panic!("{}: {}: {e}", path.display(), t.name));
        }
    }
}

#[test]
fn every_real_adapter_round_trips_through_export() {
    let Some(root) = corpus() else { return };
    let mut configs = Vec::new();
    find(&root, &|n: &str| n == "adapter_config.json", &mut configs);
    assert!(configs.len() >= 10, "only {} adapters", configs.len());
    let tmp = TempDir::new("corpus");
    for (i, config) in configs.iter().enumerate() {
        let dir = config.parent().unwrap();
        let adapter = Adapter::open(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        let out = tmp.join(&i.to_string());
        adapter.export(&out, None).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        let again = Adapter::open(&out).unwrap();
        assert_eq!(again.module_count(), adapter.module_count(), "{}", dir.display());
        for (a, b) in adapter.modules().zip(again.modules()) {
            assert_eq!((a.name(), a.kind(), a.rank()), (b.name(), b.kind(), b.rank()), "{}", dir.display());
            assert_eq!(a.scaling(), b.scaling());
            for (x, y) in a.tensors().zip(b.tensors()) {
                let dtype = x.dtype().unwrap();
                assert_eq!(x.read(dtype).unwrap(), y.read(dtype).unwrap(), "{}: {}", dir.display(), x.key());
            }
        }
    }
}
