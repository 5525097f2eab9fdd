"""Serving many adapters over one base model: ``Registry``, ``Lease``, ``lora_apply`` and ``HostModel``.

::

    with peft_c.Registry("BF16", budget_bytes=2 << 30) as registry:
        registry.register("support", "adapters/support")     # reads the config and header only
        with registry.acquire("support") as lease:          # loads once, pinned while leased
            peft_c.lora_apply("model.layers.0.self_attn.q_proj", [lease], None, x, y)   # y += LoRA(x)

Lifetimes: each object holds its C handle through an ``Owned`` (freed when the last Python reference
goes). ``close()`` / ``release()`` drop the object's own hold, so the C object goes at once unless a
call running in another thread still uses it. Leases and host models keep their adapters after the
registry is closed (the library keeps what they need). A ``HostModel`` keeps a reference to every
array given to ``add_weight`` so that their memory stays valid while the library holds pointers into
it.

Thread safety (the library's): a registry and its leases may be used from many threads at once; a
host model by one thread at a time, and nobody may touch its arrays during a ``swap``. While the host
model lives it owns the arrays' contents: read them, but do not write them (in exact mode, taking an
adapter out writes the original bytes back, whatever the arrays hold).

The package is split as ``src/capi`` splits serving: ``registry`` (``Registry``, ``Lease``,
``RegistryStats``), ``apply`` (``lora_apply``) and ``host`` (``HostModel``, ``SwapStats``).
"""

from .apply import lora_apply
from .host import HostModel, SwapStats
from .registry import Lease, Registry, RegistryStats

__all__ = ["HostModel", "Lease", "Registry", "RegistryStats", "SwapStats", "lora_apply"]
