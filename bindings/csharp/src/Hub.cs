// Model ids of the local Hugging Face hub cache, resolved offline (the "hub" section of peft_c.h).
using System;

namespace PeftC
{
    /// <summary>The local Hugging Face hub cache: model ids resolved offline. Every method that takes a base model
    /// or adapter folder also takes such an id ("org/name", "org/name@v1.0").</summary>
    public static class Hub
    {
        /// <summary>The snapshot folder of a model id in the local hub cache, or <paramref name="idOrPath"/>
        /// itself when a file or folder of that name exists. An id is "name" or "org/name", optionally with
        /// "@revision": a branch or tag under refs/ ("main" by default, "v1.0", "refs/pr/3"), a full commit hash,
        /// or a prefix of at least 4 hex digits of one snapshot's commit. The result is the folder
        /// huggingface_hub's snapshot_download(..., local_files_only=True) returns. Nothing is downloaded.
        /// Throws a PeftException with ErrorCode.NotFound when the model, revision or snapshot is not in the
        /// cache (or a short hash is ambiguous), ErrorCode.InvalidArgument for a text that is neither an
        /// existing path nor an id.</summary>
        public static string Resolve(string idOrPath)
        {
            IntPtr folder;
            PeftException.Check(Native.peft_hub_resolve(Utf8.Required(idOrPath, "idOrPath"), out folder));
            return Utf8.TakeOwned(folder);
        }

        /// <summary>The hub cache folder ids are looked up in, from the environment as huggingface_hub computes it
        /// (HF_HUB_CACHE, HUGGINGFACE_HUB_CACHE, $HF_HOME/hub, $XDG_CACHE_HOME/huggingface/hub,
        /// ~/.cache/huggingface/hub). The folder need not exist.</summary>
        public static string CacheDir
        {
            get
            {
                IntPtr folder;
                PeftException.Check(Native.peft_hub_cache_dir(out folder));
                return Utf8.TakeOwned(folder);
            }
        }
    }
}
