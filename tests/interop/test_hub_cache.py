"""Models and adapters in the Hugging Face hub cache (issue 15, items 1 and 2).

Tiny fixture models and adapters are laid into a hub cache in a temporary folder exactly as
huggingface_hub lays them out (hub_layout.py), and huggingface_hub itself (scan_cache_dir,
try_to_load_from_cache, snapshot_download with local_files_only=True) is asked first whether it
recognises the layout and where each id leads. Then:

- peft_c resolves `org/name`, `org/name@tag`, `@refs/pr/N`, full and short commit hashes to the same
  snapshot folder as huggingface_hub, and the cache folder from the environment as its constants do;
- merges from ids (single-file and sharded bases, an adapter at two revisions) are byte for byte the
  merges from the plain folders, through the C API (Python binding) and through `peftc merge`;
- `peftc merge` without --base takes the adapter's base_model_name_or_path as an id;
- an incomplete download (a blob missing, a partial blob, a shard missing from the snapshot) is
  NOT_FOUND saying so, and a link escaping the repository folder stays INVALID_CHECKPOINT;
- ids that are not ids, absent models and ambiguous short hashes are refused with clear messages.
"""

from __future__ import annotations

import filecmp
import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

from hub_layout import add_folder, add_snapshot, blob_of, commit_hash, folder_files, repo_folder

MAIN = commit_hash("main")
OLD = commit_hash("old")
# A commit sharing exactly its first 4 hex digits with MAIN (an ambiguous 4-digit short hash), by search.
TWIN = next(h for h in (commit_hash(f"twin{i}") for i in range(10**7)) if h[:4] == MAIN[:4] and h[4] != MAIN[4])
REPO = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def fixtures(fixtures_dir):
    models, adapters = fixtures_dir / "models", fixtures_dir / "adapters"
    for path in (models / "llama" / "model.safetensors", adapters / "llama_lora" / "adapter_model.safetensors",
                 adapters / "llama_lora_second" / "adapter_model.safetensors"):
        if not path.exists():
            pytest.skip(f"fixture {path} is absent (run tests/fixtures/generate.py)")
    return models, adapters


def make_sharded(source: pathlib.Path, out: pathlib.Path, shards: int = 3) -> pathlib.Path:
    """A sharded copy of a single-file model folder: the tensors split in order into `shards` files
    named as save_pretrained names them, and the index transformers writes."""
    from safetensors.numpy import load_file, save_file

    out.mkdir(parents=True)
    tensors = load_file(str(source / "model.safetensors"))
    names = sorted(tensors)
    weight_map, total = {}, 0
    for k in range(shards):
        part = {n: tensors[n] for n in names[k::shards]}
        file = f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
        save_file(part, str(out / file), metadata={"format": "pt"})
        for n, t in part.items():
            weight_map[n] = file
            total += t.nbytes
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
    for name in ("config.json", "generation_config.json"):
        shutil.copy(source / name, out / name)
    return out


@pytest.fixture(scope="module")
def cache(tmp_path_factory, fixtures):
    """A hub cache holding:
    org/llama          the llama fixture, one file (refs/main)
    org/llama-sharded  the same model in 3 shards (refs/main)
    org/llama-lora     llama_lora at MAIN (refs/main, refs/pr/1), llama_lora_second at OLD (tag v0.1),
                       and TWIN (a third snapshot whose hash starts like MAIN's)
    org/lora-by-id     llama_lora whose base_model_name_or_path is "org/llama"
    """
    models, adapters = fixtures
    root = tmp_path_factory.mktemp("hub")
    plain = root / "plain"
    sharded = make_sharded(models / "llama", plain / "llama_sharded")
    by_id = plain / "lora_by_id"
    shutil.copytree(adapters / "llama_lora", by_id)
    config = json.loads((by_id / "adapter_config.json").read_text())
    config["base_model_name_or_path"] = "org/llama"
    (by_id / "adapter_config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")

    hub = root / "hub"
    add_folder(hub, "org/llama", models / "llama", MAIN)
    add_folder(hub, "org/llama-sharded", sharded, MAIN)
    add_folder(hub, "org/llama-lora", adapters / "llama_lora", MAIN, refs=("main", "refs/pr/1"))
    add_folder(hub, "org/llama-lora", adapters / "llama_lora_second", OLD, refs=("v0.1",))
    add_folder(hub, "org/llama-lora", adapters / "llama_lora", TWIN, refs=())
    add_folder(hub, "org/lora-by-id", by_id, MAIN)
    return {"hub": hub, "sharded": sharded, "by_id": by_id, "root": root}


@pytest.fixture()
def hub_env(cache, monkeypatch):
    """HF_HUB_CACHE pointing at the test cache, for this process (the binding) and for peftc."""
    monkeypatch.setenv("HF_HUB_CACHE", str(cache["hub"]))
    return cache["hub"]


def peftc_run(peftc, *args, env=None, cwd=None):
    return subprocess.run([str(peftc), *map(str, args)], capture_output=True, text=True, env=env, cwd=cwd)


def same_folders(a: pathlib.Path, b: pathlib.Path):
    names_a = sorted(p.name for p in a.iterdir())
    names_b = sorted(p.name for p in b.iterdir())
    assert names_a == names_b
    for name in names_a:
        assert filecmp.cmp(a / name, b / name, shallow=False), f"{name} differs"


# ---- the layout is huggingface_hub's --------------------------------------------------------------

def test_huggingface_hub_recognises_the_layout(cache):
    from huggingface_hub import scan_cache_dir, try_to_load_from_cache

    info = scan_cache_dir(cache["hub"])
    assert not info.warnings, info.warnings
    repos = {r.repo_id: r for r in info.repos}
    assert set(repos) == {"org/llama", "org/llama-sharded", "org/llama-lora", "org/lora-by-id"}
    assert all(r.repo_type == "model" for r in repos.values())
    revisions = {r.commit_hash: r for r in repos["org/llama-lora"].revisions}
    assert set(revisions) == {MAIN, OLD, TWIN}
    assert set(revisions[MAIN].refs) == {"main", "refs/pr/1"} and set(revisions[OLD].refs) == {"v0.1"}
    (sharded_revision,) = repos["org/llama-sharded"].revisions
    sharded_files = {f.file_name for f in sharded_revision.files}
    assert "model-00002-of-00003.safetensors" in sharded_files
    # Each snapshot file is found where the cache says, and is the fixture's bytes.
    found = try_to_load_from_cache("org/llama-sharded", "model-00002-of-00003.safetensors", cache_dir=cache["hub"])
    assert pathlib.Path(found).read_bytes() == (cache["sharded"] / "model-00002-of-00003.safetensors").read_bytes()
    found = try_to_load_from_cache("org/llama-lora", "adapter_config.json", cache_dir=cache["hub"], revision="v0.1")
    assert pathlib.Path(found).parent.name == OLD


@pytest.mark.parametrize("revision", [None, "main", "v0.1", "refs/pr/1", MAIN, OLD, TWIN])
def test_resolution_equals_snapshot_download(peft_c, hub_env, revision):
    from huggingface_hub import snapshot_download

    expected = snapshot_download("org/llama-lora", revision=revision, local_files_only=True, cache_dir=hub_env)
    text = "org/llama-lora" if revision is None else f"org/llama-lora@{revision}"
    assert peft_c.hub_resolve(text) == expected


def test_short_hashes(peft_c, hub_env):
    snapshots = repo_folder(hub_env, "org/llama-lora") / "snapshots"
    assert peft_c.hub_resolve(f"org/llama-lora@{OLD[:7]}") == str(snapshots / OLD)
    assert peft_c.hub_resolve(f"org/llama-lora@{OLD[:4]}") == str(snapshots / OLD)
    assert peft_c.hub_resolve(f"org/llama-lora@{MAIN[:5]}") == str(snapshots / MAIN)
    with pytest.raises(peft_c.NotFoundError, match="ambiguous") as caught:
        peft_c.hub_resolve(f"org/llama-lora@{MAIN[:4]}")
    assert MAIN in str(caught.value) and TWIN in str(caught.value)
    with pytest.raises(peft_c.NotFoundError):
        peft_c.hub_resolve(f"org/llama-lora@{MAIN[:3]}")  # too short to be a hash, and no such ref


def test_cache_location_follows_huggingface_hub(peft_c, peft_c_lib, tmp_path):
    """The cache folder from the environment, as huggingface_hub's constants compute it, for each rule."""
    home = tmp_path / "home"
    home.mkdir()
    cases = [
        {"HF_HUB_CACHE": str(tmp_path / "a")},
        {"HF_HUB_CACHE": "~/hubcache", "HF_HOME": str(tmp_path / "ignored")},
        {"HUGGINGFACE_HUB_CACHE": str(tmp_path / "legacy")},
        {"HF_HOME": str(tmp_path / "hfhome")},
        {"HF_HOME": "$PEFT_TEST_VAR/x", "PEFT_TEST_VAR": str(tmp_path / "var")},
        {"HF_HOME": "${PEFT_TEST_UNSET_VAR}/y"},
        {"XDG_CACHE_HOME": str(tmp_path / "xdg")},
        {},
    ]
    probe = ("import sys; sys.path.insert(0, sys.argv[1]); import peft_c; peft_c.load_library(sys.argv[2]);"
             "from huggingface_hub import constants; print(constants.HF_HUB_CACHE); print(peft_c.hub_cache_dir())")
    for extra in cases:
        env = {k: v for k, v in os.environ.items()
               if k not in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME")}
        env.update(HOME=str(home), **extra)
        env.pop("PEFT_TEST_UNSET_VAR", None)
        proc = subprocess.run([sys.executable, "-c", probe, str(REPO / "bindings" / "python"), str(peft_c_lib)],
                              capture_output=True, text=True, env=env)
        assert proc.returncode == 0, proc.stderr
        theirs, ours = proc.stdout.splitlines()
        assert ours == theirs, extra
    assert (home / ".cache" / "huggingface" / "hub").as_posix() == theirs  # the last case: the default


def test_hf_home_and_default_location_are_used(peftc_binary, cache, fixtures, tmp_path):
    """peftc finds an id under HF_HOME/hub and under ~/.cache/huggingface/hub (HOME set to a temp dir)."""
    models, _ = fixtures
    home = tmp_path / "home"
    hf_home = tmp_path / "hf_home"
    add_folder(home / ".cache" / "huggingface" / "hub", "org/at-home", models / "llama", MAIN)
    add_folder(hf_home / "hub", "org/in-hf-home", models / "llama", OLD)
    env = {k: v for k, v in os.environ.items()
           if k not in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME")}
    env["HOME"] = str(home)
    proc = peftc_run(peftc_binary, "resolve", "org/at-home", env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(repo_folder(home / ".cache" / "huggingface" / "hub", "org/at-home") / "snapshots" / MAIN)
    proc = peftc_run(peftc_binary, "inspect", "org/at-home", env=env)
    assert proc.returncode == 0, proc.stderr
    proc = peftc_run(peftc_binary, "resolve", "org/in-hf-home", env=env)
    assert proc.returncode == 1 and "NOT_FOUND" in proc.stderr and str(home / ".cache" / "huggingface" / "hub") in proc.stderr
    env["HF_HOME"] = str(hf_home)
    proc = peftc_run(peftc_binary, "resolve", "org/in-hf-home", env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(repo_folder(hf_home / "hub", "org/in-hf-home") / "snapshots" / OLD)


# ---- merges from ids equal merges from the plain folders ---------------------------------------------

@pytest.mark.parametrize("base_id, plain", [("org/llama", "llama"), ("org/llama-sharded", "sharded")])
def test_merge_from_ids_equals_merge_from_folders(peft_c, hub_env, cache, fixtures, tmp_path, base_id, plain):
    models, adapters = fixtures
    plain_base = models / "llama" if plain == "llama" else cache["sharded"]
    ours = peft_c.merge_checkpoint(base_id, tmp_path / "from_ids", ["org/llama-lora", ("org/llama-lora@v0.1", 0.5)])
    theirs = peft_c.merge_checkpoint(plain_base, tmp_path / "from_folders",
                                     [adapters / "llama_lora", (adapters / "llama_lora_second", 0.5)])
    assert ours.files == theirs.files and ours.merged == theirs.merged > 0
    same_folders(tmp_path / "from_ids", tmp_path / "from_folders")
    if plain == "sharded":
        assert (tmp_path / "from_ids" / "model.safetensors.index.json").exists()


def test_ids_everywhere_in_the_binding(peft_c, hub_env, fixtures):
    models, adapters = fixtures
    with peft_c.Checkpoint.open("org/llama-sharded") as sharded, peft_c.Checkpoint.open(models / "llama") as single:
        assert sorted(sharded) == sorted(single)
        for name in single:
            assert sharded.read(name).tobytes() == single.read(name).tobytes()
    adapter = peft_c.Adapter.open("org/llama-lora@v0.1", base_dir="org/llama")
    plain = peft_c.Adapter.open(adapters / "llama_lora_second", base_dir=models / "llama")
    assert len(adapter) == len(plain)


def test_cli_merge_from_ids(peftc_binary, cache, fixtures, tmp_path):
    models, adapters = fixtures
    env = dict(os.environ, HF_HUB_CACHE=str(cache["hub"]))
    proc = peftc_run(peftc_binary, "merge", "--base", "org/llama-sharded", "--adapter", "org/llama-lora@v0.1:0.5",
                     "--out", tmp_path / "ids", env=env)
    assert proc.returncode == 0, proc.stderr
    snapshots = repo_folder(cache["hub"], "org/llama-sharded") / "snapshots"
    assert f"base: org/llama-sharded -> {snapshots / MAIN}" in proc.stderr
    assert f"adapter: org/llama-lora@v0.1 -> {repo_folder(cache['hub'], 'org/llama-lora') / 'snapshots' / OLD}" in proc.stderr
    proc = peftc_run(peftc_binary, "merge", "--base", cache["sharded"], "--adapter",
                     f"{adapters / 'llama_lora_second'}:0.5", "--out", tmp_path / "plain", env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""  # plain folders: nothing to say
    same_folders(tmp_path / "ids", tmp_path / "plain")


def test_cli_merge_without_base_uses_base_model_name_or_path(peftc_binary, cache, fixtures, tmp_path):
    models, adapters = fixtures
    env = dict(os.environ, HF_HUB_CACHE=str(cache["hub"]))
    proc = peftc_run(peftc_binary, "merge", "--adapter", "org/lora-by-id", "--out", tmp_path / "auto", env=env)
    assert proc.returncode == 0, proc.stderr
    assert f"base: org/llama -> {repo_folder(cache['hub'], 'org/llama') / 'snapshots' / MAIN}" in proc.stderr
    proc = peftc_run(peftc_binary, "merge", "--base", models / "llama", "--adapter", adapters / "llama_lora",
                     "--out", tmp_path / "plain", env=env)
    assert proc.returncode == 0, proc.stderr
    same_folders(tmp_path / "auto", tmp_path / "plain")
    # base_model_name_or_path as a path (relative to the working directory), as PEFT reads it.
    if not (models.parents[2] / "tests" / "fixtures" / "models" / "llama").is_dir():
        pytest.skip("the fixtures are not under a repository checkout (PEFT_TEST_DATA)")
    proc = peftc_run(peftc_binary, "merge", "--adapter", adapters / "llama_lora", "--out", tmp_path / "relative",
                     env=env, cwd=models.parents[2])
    assert proc.returncode == 0, proc.stderr
    assert "base: tests/fixtures/models/llama -> tests/fixtures/models/llama" in proc.stderr
    same_folders(tmp_path / "relative", tmp_path / "plain")
    # Neither a folder nor an id in the cache: a usage error that says to pass --base.
    proc = peftc_run(peftc_binary, "merge", "--adapter", adapters / "llama_lora", "--out", tmp_path / "none",
                     env=env, cwd=tmp_path)
    assert proc.returncode == 2
    assert "merge needs --base" in proc.stderr and "tests/fixtures/models/llama" in proc.stderr
    assert not (tmp_path / "none").exists()


# ---- incomplete downloads and escapes ------------------------------------------------------------------

@pytest.fixture()
def broken(cache, tmp_path, monkeypatch):
    """A cache of its own, for damaging: org/sharded at MAIN, and HF_HUB_CACHE pointing at it."""
    hub = tmp_path / "hub"
    snapshot = add_folder(hub, "org/sharded", cache["sharded"], MAIN)
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    return hub, snapshot


def test_missing_blob_is_an_incomplete_download(peft_c, peftc_binary, broken, tmp_path):
    hub, snapshot = broken
    blob = blob_of(snapshot, "model-00002-of-00003.safetensors")
    blob.unlink()
    with pytest.raises(peft_c.NotFoundError) as caught:
        peft_c.Checkpoint.open("org/sharded")
    message = str(caught.value)
    assert f"{snapshot}/model-00002-of-00003.safetensors" in message
    assert "the download of \"org/sharded\" into the Hugging Face hub cache is incomplete" in message
    assert "downloads nothing" in message
    # With the partial blob huggingface_hub leaves while downloading, the message names it.
    partial = blob.parent / (blob.name + ".incomplete")
    partial.write_bytes(b"\0" * 10)
    with pytest.raises(peft_c.NotFoundError, match="is a partial download"):
        peft_c.Checkpoint.open(snapshot)  # the snapshot's path too, not only the id
    proc = peftc_run(peftc_binary, "inspect", "org/sharded")
    assert proc.returncode == 1
    assert proc.stderr.startswith(f"peftc: error: NOT_FOUND: {snapshot}/model-00002-of-00003.safetensors")
    assert str(partial) in proc.stderr


def test_missing_shard_is_an_incomplete_download(peft_c, peftc_binary, broken, fixtures, tmp_path):
    hub, snapshot = broken
    (snapshot / "model-00003-of-00003.safetensors").unlink()  # the link itself: never downloaded
    (repo_folder(hub, "org/sharded") / "blobs" / ("0" * 64 + ".incomplete")).write_bytes(b"")
    with pytest.raises(peft_c.NotFoundError) as caught:
        peft_c.Checkpoint.open("org/sharded")
    message = str(caught.value)
    assert "model-00003-of-00003.safetensors: the shard named by the index is missing from the snapshot" in message
    assert "1 partial download(s)" in message and "incomplete" in message
    proc = peftc_run(peftc_binary, "merge", "--base", "org/sharded", "--adapter", fixtures[1] / "llama_lora",
                     "--out", tmp_path / "out")
    assert proc.returncode == 1 and "peftc: error: NOT_FOUND:" in proc.stderr
    assert not (tmp_path / "out").exists()


def test_plain_folder_keeps_its_error(peft_c, cache, tmp_path):
    plain = tmp_path / "plain"
    shutil.copytree(cache["sharded"], plain)
    (plain / "model-00003-of-00003.safetensors").unlink()
    with pytest.raises(peft_c.InvalidCheckpointError, match="does not exist"):
        peft_c.Checkpoint.open(plain)


def test_missing_adapter_blob_is_an_incomplete_download(peft_c, cache, fixtures, tmp_path, monkeypatch):
    _, adapters = fixtures
    hub = tmp_path / "hub"
    snapshot = add_folder(hub, "org/lora", adapters / "llama_lora", MAIN)
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    blob_of(snapshot, "adapter_model.safetensors").unlink()
    with pytest.raises(peft_c.NotFoundError, match="adapter_model.safetensors: the file links to .*incomplete"):
        peft_c.Adapter.open("org/lora")


def test_link_escaping_the_repository_is_refused(peft_c, peftc_binary, broken, cache, tmp_path):
    hub, snapshot = broken
    outside = tmp_path / "outside.safetensors"
    shutil.copy(cache["sharded"] / "model-00001-of-00003.safetensors", outside)
    link = snapshot / "model-00001-of-00003.safetensors"
    link.unlink()
    link.symlink_to(os.path.relpath(outside, link.parent))
    with pytest.raises(peft_c.InvalidCheckpointError, match="outside the hub cache repository folder"):
        peft_c.Checkpoint.open("org/sharded")
    proc = peftc_run(peftc_binary, "inspect", "org/sharded")
    assert proc.returncode == 1 and "peftc: error: INVALID_CHECKPOINT:" in proc.stderr


# ---- what is not found or not an id -----------------------------------------------------------------------

def test_absent_models_and_revisions(peft_c, hub_env):
    with pytest.raises(peft_c.NotFoundError) as caught:
        peft_c.hub_resolve("org/absent")
    message = str(caught.value)
    assert "\"org/absent\"" in message and str(hub_env) in message and "models--org--absent" in message
    assert "downloads nothing" in message
    with pytest.raises(peft_c.NotFoundError, match=r"revision \"v9\".*refs/ names \"main\", \"refs/pr/1\", \"v0.1\""):
        peft_c.hub_resolve("org/llama-lora@v9")
    with pytest.raises(peft_c.NotFoundError, match="no snapshot folder"):
        peft_c.hub_resolve("org/llama-lora@" + "f" * 40)
    # Where a folder is taken, an id-shaped name that is neither gives the hub's NOT_FOUND.
    with pytest.raises(peft_c.NotFoundError, match="models--org--absent"):
        peft_c.Adapter.open("org/absent")


@pytest.mark.parametrize("text", ["/no/such/folder", "../up", "a/b/c", "org/", "/org/name", "org/na..me",
                                  "org/name--x", "org/-name", "org/name.git", "org/name@", "org/name@../x",
                                  "org/name@a//b", "org/na me"])
def test_texts_that_are_not_ids(peft_c, hub_env, text):
    with pytest.raises(peft_c.InvalidArgumentError, match="is neither an existing path nor a model id"):
        peft_c.hub_resolve(text)


def test_existing_path_wins(peft_c, hub_env, tmp_path, monkeypatch):
    (tmp_path / "org" / "llama").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    assert peft_c.hub_resolve("org/llama") == "org/llama"
    assert peft_c.hub_resolve(str(tmp_path)) == str(tmp_path)


def test_bare_names(peft_c, hub_env, fixtures, tmp_path, monkeypatch):
    """huggingface_hub's legacy ids without a namespace ("gpt2") resolve through peft_hub_resolve."""
    models, _ = fixtures
    add_folder(hub_env, "tinyllama", models / "llama", MAIN)
    monkeypatch.chdir(tmp_path)
    assert peft_c.hub_resolve("tinyllama") == str(repo_folder(hub_env, "tinyllama") / "snapshots" / MAIN)
    shutil.rmtree(repo_folder(hub_env, "tinyllama"))


# ---- review findings: refs that hold no hash, subfolders, single files leaving the folder -----------------

@pytest.mark.parametrize("content", [b"\0", b"not a hash", MAIN.upper().encode(), MAIN[:39].encode(),
                                     (MAIN + "0").encode(), b"x" * 5000])
def test_refs_that_hold_no_commit_hash(peft_c, broken, content):
    """A ref must hold a 40-digit lowercase hash, as huggingface_hub writes it; anything else (a NUL, a
    short or long text, an oversized file) is NOT_FOUND saying so, never a path built from it."""
    hub, _ = broken
    (repo_folder(hub, "org/sharded") / "refs" / "odd").write_bytes(content)
    with pytest.raises(peft_c.NotFoundError, match="refs/odd holds no commit hash"):
        peft_c.hub_resolve("org/sharded@odd")


def test_sharded_model_in_a_snapshot_subfolder(peft_c, cache, fixtures, tmp_path, monkeypatch):
    """Weights kept in a subfolder of a snapshot link to ../../../blobs: still inside the repository."""
    hub = tmp_path / "hub"
    files = {f"text_encoder/{name}": content for name, content in folder_files(cache["sharded"]).items()}
    snapshot = add_snapshot(hub, "org/pipeline", files, MAIN)
    assert os.readlink(snapshot / "text_encoder" / "model-00001-of-00003.safetensors").startswith("../../../blobs/")
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    with peft_c.Checkpoint.open(snapshot / "text_encoder") as inside, peft_c.Checkpoint.open(cache["sharded"]) as plain:
        assert sorted(inside.keys()) == sorted(plain.keys())


def test_single_file_leaving_the_folder_is_refused(peft_c, peftc_binary, cache, fixtures, tmp_path, monkeypatch):
    """model.safetensors (like the index and the shards) must resolve inside the folder, or inside the
    repository folder for a snapshot."""
    models, _ = fixtures
    outside = tmp_path / "outside" / "model.safetensors"
    outside.parent.mkdir()
    shutil.copy(models / "llama" / "model.safetensors", outside)
    hub = tmp_path / "hub"
    snapshot = add_folder(hub, "org/single", models / "llama", MAIN)
    link = snapshot / "model.safetensors"
    link.unlink()
    link.symlink_to(outside)
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    with pytest.raises(peft_c.InvalidCheckpointError, match="outside the hub cache repository folder"):
        peft_c.Checkpoint.open("org/single")
    plain = tmp_path / "plain"
    shutil.copytree(models / "llama", plain)
    (plain / "model.safetensors").unlink()
    (plain / "model.safetensors").symlink_to(outside)
    with pytest.raises(peft_c.InvalidCheckpointError, match="the weight file resolves to .*, outside the folder"):
        peft_c.Checkpoint.open(plain)
    # A link inside the folder is fine.
    (plain / "model.safetensors").unlink()
    shutil.copy(outside, plain / "weights.bin")
    (plain / "model.safetensors").symlink_to("weights.bin")
    with peft_c.Checkpoint.open(plain) as ckpt:
        assert len(ckpt) > 0
