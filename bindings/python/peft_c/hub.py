"""Model ids of the local Hugging Face hub cache, resolved offline (the ``hub`` section of peft_c.h).

Every function of this package that takes a base model or adapter folder also takes such an id
(``"org/name"``, ``"org/name@v1.0"``); these two show where an id leads and which cache is used.
"""

from __future__ import annotations

import os
from ctypes import byref, c_void_p
from typing import Union

from ._helpers import fs_path
from ._lib import check, lib, take_string


def hub_resolve(id_or_path: Union[str, "os.PathLike[str]"]) -> str:
    """The snapshot folder of a model id in the hub cache, or the path itself when it exists.

    ``id_or_path`` is ``"name"``, ``"org/name"`` or either with ``"@revision"`` (a branch or tag
    under ``refs/``, a full commit hash, or a prefix of at least 4 hex digits of one snapshot's
    commit); ``"main"`` by default. The result is the folder that
    ``huggingface_hub.snapshot_download(repo_id, revision=..., local_files_only=True)`` returns.
    Nothing is downloaded. Raises ``NotFoundError`` when the model, revision or snapshot is not in
    the cache (or a short hash is ambiguous), ``InvalidArgumentError`` for a text that is neither an
    existing path nor a model id.
    """
    out = c_void_p()
    check(lib().peft_hub_resolve(fs_path(id_or_path, "id_or_path"), byref(out)))
    return take_string(out)


def hub_cache_dir() -> str:
    """The hub cache folder ids are looked up in, from the environment as huggingface_hub computes it
    (``HF_HUB_CACHE``, ``HUGGINGFACE_HUB_CACHE``, ``HF_HOME/hub``, ``XDG_CACHE_HOME/huggingface/hub``,
    ``~/.cache/huggingface/hub``). The folder need not exist."""
    out = c_void_p()
    check(lib().peft_hub_cache_dir(byref(out)))
    return take_string(out)


__all__ = ["hub_cache_dir", "hub_resolve"]
