package peft

/*
#include <stdlib.h>
#include <peft_c.h>
*/
import "C"

// HubResolve returns the snapshot folder of a model id in the local Hugging Face hub cache, or
// idOrPath itself when a file or folder of that name exists. An id is "name" or "org/name",
// optionally with "@revision": a branch or tag under refs/ ("main" by default, "v1.0",
// "refs/pr/3"), a full commit hash, or a prefix of at least 4 hex digits of one snapshot's commit.
// The result is the folder huggingface_hub's snapshot_download(..., local_files_only=True) returns.
// Nothing is downloaded. ErrNotFound when the model, revision or snapshot is not in the cache (or a
// short hash is ambiguous); ErrInvalidArgument for a text that is neither an existing path nor an
// id. Every function taking a base model or adapter folder also takes such an id.
func HubResolve(idOrPath string) (string, error) {
	var cs cstrings
	defer cs.free()
	cid, err := cs.add(idOrPath, "idOrPath")
	if err != nil {
		return "", err
	}
	var out *C.char
	if err := takeError(C.peft_hub_resolve(cid, &out)); err != nil {
		return "", err
	}
	return takeString(out), nil
}

// HubCacheDir returns the hub cache folder ids are looked up in, from the environment as
// huggingface_hub computes it (HF_HUB_CACHE, HUGGINGFACE_HUB_CACHE, $HF_HOME/hub,
// $XDG_CACHE_HOME/huggingface/hub, ~/.cache/huggingface/hub). The folder need not exist.
func HubCacheDir() (string, error) {
	var out *C.char
	if err := takeError(C.peft_hub_cache_dir(&out)); err != nil {
		return "", err
	}
	return takeString(out), nil
}
