#!/usr/bin/env python3
"""Small hostile files for tests/cli/reliability.sh, with struct only (no numpy):

    hostile_files.py set-values SRC.safetensors DST.safetensors TENSOR VALUE [INDEX...]
        copies an F32 safetensors file, setting elements INDEX (default 0) of TENSOR to VALUE
        (a float, 'nan', 'inf', '-inf')
    hostile_files.py set-json SRC.safetensors DST.safetensors TENSOR FIELD JSON
        copies a safetensors file, setting FIELD of TENSOR's header entry (or of __metadata__)
    hostile_files.py gguf-f32 SRC.gguf DST.gguf KEY VALUE
        copies a GGUF file, setting the F32 metadata value KEY to VALUE (same size, patched in place)
    hostile_files.py replace SRC DST OLD_HEX NEW_HEX
        copies a file, replacing the first occurrence of bytes OLD_HEX with NEW_HEX (same length)
    hostile_files.py gguf-many-kv DST SIZE
        writes a GGUF file of about SIZE bytes holding only the smallest distinct u8 key-value pairs
        (ASCII keys of 1, 2, 3, then 4 bytes: 14 to 17 file bytes a pair) and no tensors
    hostile_files.py gguf-bool DST BYTE [array]
        writes a GGUF file without tensors whose key "flag" is a bool stored as the byte BYTE, or
        with "array", a bool array [0, 1, BYTE]
    hostile_files.py lora DIR MODULE OUT IN [VALUE]
        writes a rank-1 LoRA adapter folder for MODULE (out x in), every factor element VALUE (0.5)
"""
import json
import struct
import sys


def read(path):
    raw = open(path, "rb").read()
    n = struct.unpack_from("<Q", raw, 0)[0]
    return json.loads(raw[8:8 + n]), bytearray(raw[8 + n:])


def write(path, header, data):
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    open(path, "wb").write(struct.pack("<Q", len(text)) + text + bytes(data))


def main(argv):
    cmd = argv[1]
    if cmd == "set-values":
        src, dst, name, value = argv[2:6]
        header, data = read(src)
        begin = header[name]["data_offsets"][0]
        for index in [int(i) for i in argv[6:]] or [0]:
            struct.pack_into("<f", data, begin + 4 * index, float(value))
        write(dst, header, data)
    elif cmd == "set-json":
        src, dst, name, field, value = argv[2:7]
        header, data = read(src)
        header[name][field] = json.loads(value)
        write(dst, header, data)
    elif cmd == "gguf-f32":
        src, dst, key, value = argv[2:6]
        raw = bytearray(open(src, "rb").read())
        needle = struct.pack("<Q", len(key)) + key.encode()
        at = raw.index(needle) + len(needle)
        assert struct.unpack_from("<I", raw, at)[0] == 6, "not an F32 value"
        struct.pack_into("<f", raw, at + 4, float(value))
        open(dst, "wb").write(bytes(raw))
    elif cmd == "replace":
        src, dst, old, new = argv[2], argv[3], bytes.fromhex(argv[4]), bytes.fromhex(argv[5])
        assert len(old) == len(new)
        raw = open(src, "rb").read()
        assert old in raw
        open(dst, "wb").write(raw.replace(old, new, 1))
    elif cmd == "gguf-many-kv":
        dst, size = argv[2], int(argv[3])
        import itertools
        pairs = []
        used = 24
        for length in itertools.count(1):
            for key in itertools.product(range(1, 128), repeat=length):
                if used + 13 + length > size:
                    break
                pairs.append(struct.pack("<Q", length) + bytes(key) + b"\x00\x00\x00\x00\x00")
                used += 13 + length
            else:
                continue
            break
        with open(dst, "wb") as f:
            f.write(b"GGUF" + struct.pack("<IQQ", 3, 0, len(pairs)))
            f.write(b"".join(pairs))
    elif cmd == "gguf-bool":
        dst, byte = argv[2], int(argv[3])
        value = struct.pack("<I", 7) + bytes([byte])
        if argv[4:] == ["array"]:
            value = struct.pack("<IIQ", 9, 7, 3) + bytes([0, 1, byte])
        with open(dst, "wb") as f:
            f.write(b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", 4) + b"flag" + value)
    elif cmd == "lora":
        folder, module, rows, cols = argv[2], argv[3], int(argv[4]), int(argv[5])
        value = float(argv[6]) if len(argv) > 6 else 0.5
        key = "base_model.model." + module
        header = {key + ".lora_A.weight": {"dtype": "F32", "shape": [1, cols], "data_offsets": [0, 4 * cols]},
                  key + ".lora_B.weight": {"dtype": "F32", "shape": [rows, 1],
                                           "data_offsets": [4 * cols, 4 * (cols + rows)]}}
        import os
        os.makedirs(folder, exist_ok=True)
        write(folder + "/adapter_model.safetensors", header, struct.pack("<f", value) * (cols + rows))
        config = {"peft_type": "LORA", "r": 1, "lora_alpha": 1, "target_modules": [module.split(".")[-1]],
                  "base_model_name_or_path": "", "task_type": "CAUSAL_LM"}
        open(folder + "/adapter_config.json", "w").write(json.dumps(config))
    else:
        sys.exit("unknown command " + cmd)


if __name__ == "__main__":
    main(sys.argv)
