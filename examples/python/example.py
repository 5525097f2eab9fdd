"""Open a LoRA adapter, validate it against its base model, merge it into the base, and export it.

usage: python example.py BASE_DIR ADAPTER_DIR OUT_DIR   (writes OUT_DIR/merged and OUT_DIR/adapter)
"""
import os
import sys

import peft_c


def main():
    base, adapter_dir, out = sys.argv[1:4]
    with peft_c.Adapter.open(adapter_dir, base_dir=base) as adapter:  # opening with a base validates
        print(f"adapter: {len(list(adapter))} modules, validated against {base}")
        result = peft_c.merge_checkpoint(base, os.path.join(out, "merged"), [(adapter_dir, 1.0)])
        print(f"merged: {result}")
        peft_c.export_adapter(adapter, os.path.join(out, "adapter"))
        print(f"exported to {os.path.join(out, 'adapter')}")


if __name__ == "__main__":
    main()
