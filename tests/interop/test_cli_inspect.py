"""`peftc inspect --json` against the real safetensors package on the fixtures and the real corpus:
same tensors in the same file order, same dtypes, shapes, data_offsets and metadata; and the CLI's
error contract (status 1 and `peftc: error: CODE: ...`) on the malformed corpus."""
import json
import os
import pathlib
import subprocess

import pytest
from safetensors import safe_open

ROOT = pathlib.Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"
CORPUS = pathlib.Path(os.environ.get("PEFT_CORPUS", ROOT.parent / "shared" / "corpus" / "real"))
PEFTC = os.environ.get("PEFTC", str(ROOT / "build" / "peftc"))


def fixture_files():
    return sorted((FIXTURES / "safetensors").glob("*.safetensors"))


def corpus_files():
    return sorted(CORPUS.rglob("*.safetensors")) if CORPUS.is_dir() else []


def reference_view(path):
    """What the reference says of a file: tensors in data order with their header fields."""
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    with safe_open(str(path), framework="np") as f:
        metadata = f.metadata()
        names = list(f.keys())
        infos = {}
        for name in names:
            entry = header[name]
            infos[name] = (entry["dtype"], list(entry["shape"]), list(entry["data_offsets"]))
    order = sorted(names, key=lambda k: tuple(infos[k][2]))
    return order, infos, metadata


def run_inspect(path):
    proc = subprocess.run([PEFTC, "inspect", str(path), "--json"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def check_same(path):
    order, infos, metadata = reference_view(path)
    ours = run_inspect(path)
    # Data order; zero-size tensors that share an offset have no order of their own (the reference
    # visits them in hash-map order), so only the offsets must not decrease.
    assert sorted(t["name"] for t in ours["tensors"]) == sorted(order)
    offsets = [t["data_offsets"] for t in ours["tensors"]]
    assert offsets == sorted(offsets)
    for t in ours["tensors"]:
        assert (t["dtype"], t["shape"], t["data_offsets"]) == tuple(infos[t["name"]])
    assert ours["metadata"] == metadata


@pytest.mark.parametrize("path", fixture_files(), ids=lambda p: p.name)
def test_fixture_inspect_matches_reference(path):
    check_same(path)


@pytest.mark.skipif(not corpus_files(), reason=f"real corpus absent at {CORPUS}")
@pytest.mark.parametrize("path", corpus_files(), ids=lambda p: str(p.relative_to(CORPUS)))
def test_corpus_inspect_matches_reference(path):
    check_same(path)


def test_fixtures_present():
    assert fixture_files(), "tests/fixtures/safetensors is committed and must not be empty"


def malformed_cases():
    expected = FIXTURES / "malformed" / "expected.json"
    if not expected.exists():
        return []
    return sorted(json.loads(expected.read_text()).items())


@pytest.mark.parametrize("name,case", malformed_cases(), ids=lambda x: x if isinstance(x, str) else "")
def test_malformed_exit_status_and_code(name, case):
    proc = subprocess.run([PEFTC, "inspect", str(FIXTURES / "malformed" / name)],
                          capture_output=True, text=True)
    assert proc.returncode == 1
    assert proc.stderr.startswith(f"peftc: error: {case['code']}: "), proc.stderr
    assert proc.stdout == ""


def test_usage_errors_exit_2():
    for args in ([], ["inspect"], ["inspect", "a", "b"], ["inspect", "--bogus", "x"], ["no-such-command"]):
        proc = subprocess.run([PEFTC, *args], capture_output=True, text=True)
        assert proc.returncode == 2, (args, proc.stderr)


def test_missing_file_is_io_error(tmp_path):
    proc = subprocess.run([PEFTC, "inspect", str(tmp_path / "absent.safetensors")],
                          capture_output=True, text=True)
    assert proc.returncode == 1
    assert proc.stderr.startswith("peftc: error: IO: ")


def test_sharded_folder_lists_files():
    folder = FIXTURES / "safetensors" / "sharded"
    if not folder.is_dir():
        pytest.fail("tests/fixtures/safetensors/sharded is committed and must exist")
    ours = run_inspect(folder)
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    assert {t["name"]: t["file"] for t in ours["tensors"]} == index["weight_map"]
    assert ours["metadata"] == index.get("metadata")
