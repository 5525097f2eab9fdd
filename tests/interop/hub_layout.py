"""Laying folders into a Hugging Face hub cache exactly as huggingface_hub does, for test_hub_cache.py.

<cache>/models--org--name/
    blobs/<hash>                           the files' contents; <hash> is the sha256 of an LFS file
                                           (weights) and the git blob sha1 of any other file, as the
                                           Hub's etags are
    refs/<branch or tag>                   the commit hash, no newline
    snapshots/<commit>/<file>              -> ../../blobs/<hash> (relative links)
    snapshots/<commit>/<dir>/<file>        -> ../../../blobs/<hash>

Imported by the test module (pytest puts this folder on sys.path). Plain Python: no torch.
"""

from __future__ import annotations

import hashlib
import os
import pathlib
from typing import Dict, Iterable, Union

LFS_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")

Content = Union[bytes, pathlib.Path]


def repo_folder(cache: pathlib.Path, repo_id: str) -> pathlib.Path:
    """huggingface_hub's repo_folder_name for a model: models--org--name."""
    return cache / "--".join(["models", *repo_id.split("/")])


def blob_name(name: str, data: bytes) -> str:
    if name.endswith(LFS_SUFFIXES):
        return hashlib.sha256(data).hexdigest()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def commit_hash(seed: str) -> str:
    """A 40-digit commit hash made from `seed` (commits are opaque to the cache)."""
    return hashlib.sha1(seed.encode()).hexdigest()


def folder_files(folder: pathlib.Path) -> Dict[str, Content]:
    """Every file of a plain folder (recursively), by relative name."""
    return {p.relative_to(folder).as_posix(): p for p in sorted(folder.rglob("*")) if p.is_file()}


def add_snapshot(cache: pathlib.Path, repo_id: str, files: Dict[str, Content], commit: str,
                 refs: Iterable[str] = ("main",)) -> pathlib.Path:
    """Lays `files` (relative name -> bytes or a file to copy) out as snapshot `commit` of `repo_id`,
    with each of `refs` (e.g. "main", "v1", "refs/pr/1") pointing at it. Returns the snapshot folder."""
    repo = repo_folder(cache, repo_id)
    snapshot = repo / "snapshots" / commit
    for name, content in files.items():
        data = content.read_bytes() if isinstance(content, pathlib.Path) else content
        blob = repo / "blobs" / blob_name(name, data)
        blob.parent.mkdir(parents=True, exist_ok=True)
        if not blob.exists():
            blob.write_bytes(data)
        pointer = snapshot / name
        pointer.parent.mkdir(parents=True, exist_ok=True)
        pointer.symlink_to(os.path.relpath(blob, pointer.parent))
    snapshot.mkdir(parents=True, exist_ok=True)
    for ref in refs:
        path = repo / "refs" / ref
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(commit)
    return snapshot


def add_folder(cache: pathlib.Path, repo_id: str, folder: pathlib.Path, commit: str,
               refs: Iterable[str] = ("main",)) -> pathlib.Path:
    """add_snapshot with every file of a plain folder."""
    return add_snapshot(cache, repo_id, folder_files(folder), commit, refs)


def blob_of(snapshot: pathlib.Path, name: str) -> pathlib.Path:
    """The blob a snapshot file links to."""
    pointer = snapshot / name
    return (pointer.parent / os.readlink(pointer)).resolve()
