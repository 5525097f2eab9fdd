//! Model ids resolved in a hub cache laid out as huggingface_hub lays it out. One test in its own
//! binary: it sets HF_HUB_CACHE, which no other thread may read meanwhile.

mod common;

use std::path::{Path, PathBuf};

use common::{expect_code, fixture, sha256_hex, TempDir};
use peft_c::{hub_cache_dir, hub_resolve, Checkpoint, ErrorCode};

/// Lays the files of `src` into `cache` as snapshot `commit` of `repo` (blobs named by their
/// sha256, relative links from the snapshot, refs/main). Returns the snapshot folder.
fn lay_snapshot(cache: &Path, repo: &str, commit: &str, src: &Path) -> PathBuf {
    let root = cache.join(format!("models--{}", repo.replace('/', "--")));
    let snapshot = root.join("snapshots").join(commit);
    for dir in [root.join("blobs"), root.join("refs"), snapshot.clone()] {
        std::fs::create_dir_all(dir).unwrap();
    }
    for entry in std::fs::read_dir(src).unwrap() {
        let entry = entry.unwrap();
        let data = std::fs::read(entry.path()).unwrap();
        let blob = sha256_hex(&data);
        std::fs::write(root.join("blobs").join(&blob), &data).unwrap();
        std::os::unix::fs::symlink(Path::new("../../blobs").join(&blob), snapshot.join(entry.file_name())).unwrap();
    }
    std::fs::write(root.join("refs").join("main"), commit).unwrap();
    snapshot
}

#[test]
fn ids_resolve_in_the_hub_cache() {
    let model = fixture(&["models", "llama"]);
    if !model.join("model.safetensors").exists() {
        eprintln!("skipped: fixture {} absent", model.display());
        return;
    }
    let cache = TempDir::new("hub");
    std::env::set_var("HF_HUB_CACHE", cache.path());
    let commit = "cd34".repeat(10);
    let snapshot = lay_snapshot(cache.path(), "org/tiny", &commit, &model);

    assert_eq!(hub_cache_dir().unwrap(), cache.path());
    for id in
        ["org/tiny".to_owned(), "org/tiny@main".to_owned(), format!("org/tiny@{commit}"), "org/tiny@cd34c".to_owned()]
    {
        assert_eq!(hub_resolve(&id).unwrap(), snapshot, "{id}");
    }
    assert_eq!(hub_resolve(&model).unwrap(), model, "an existing path is returned as it is");

    let by_id = Checkpoint::open("org/tiny").unwrap();
    let by_path = Checkpoint::open(&model).unwrap();
    assert!(!by_id.is_empty());
    assert_eq!(by_id.len(), by_path.len());

    let error = expect_code(hub_resolve("org/absent"), ErrorCode::NotFound);
    assert!(error.message().contains(&cache.path().display().to_string()), "{error}");
    let error = expect_code(hub_resolve("org/tiny@v9"), ErrorCode::NotFound);
    assert!(error.message().contains("\"main\""), "{error}");
    for text in ["../up", "a/b/c", "/no/such/folder", "org/name@"] {
        expect_code(hub_resolve(text), ErrorCode::InvalidArgument);
    }
    expect_code(hub_resolve("org/ti\0ny"), ErrorCode::InvalidArgument);
    std::env::remove_var("HF_HUB_CACHE");
}
