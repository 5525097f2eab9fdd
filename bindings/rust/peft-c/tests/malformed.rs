//! Every malformed fixture fails with the code tests/fixtures/malformed/expected.json gives (the
//! reference's failure kind, or peft_c's stricter verdict), opened from a file by mmap and by
//! pread and from memory, with a message.

mod common;

use common::{code_by_name, fixture, read_json};
use peft_c::{Checkpoint, OpenOptions};

#[test]
fn malformed_fixtures_fail_with_the_expected_code() {
    let expected = read_json(&fixture(&["malformed", "expected.json"]));
    let cases = expected.as_object().unwrap();
    assert!(cases.len() >= 50, "only {} malformed cases", cases.len());
    let mut pread = OpenOptions::new().unwrap();
    pread.set_use_pread(true).unwrap();
    let mut failures = Vec::new();
    for (name, case) in cases {
        let want = code_by_name(case["code"].as_str().unwrap());
        let path = fixture(&["malformed", name]);
        let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{name}: {e}"));
        let results = [
            ("mmap", Checkpoint::open(&path)),
            ("pread", Checkpoint::open_with(&path, &pread)),
            ("memory", Checkpoint::from_bytes(&bytes)),
        ];
        for (mode, result) in results {
            match result {
                Ok(_) => failures.push(format!("{name} ({mode}): opened; want {want}")),
                Err(e) if e.code() != want => failures.push(format!("{name} ({mode}): {e}; want {want}")),
                Err(e) if e.message().is_empty() => failures.push(format!("{name} ({mode}): empty message")),
                Err(_) => {}
            }
        }
    }
    assert!(failures.is_empty(), "{} failure(s):\n{}", failures.len(), failures.join("\n"));
}
