#!/usr/bin/env python3
"""Differential test of peft_c's safetensors header parser against the reference package.

Generates headers (hand-written edge cases, random structured headers, byte mutations of valid
files, numbers near the double range), writes each as a file, and compares the error kind that the
real `safetensors` package reports from `safe_open` with what `header_check` (tests/fuzz/
header_check.cpp, built next to the fuzzer) prints. Also:
  --reference-codes DIR OUT   write {"file": "CODE"} for every file in DIR, as the reference sees it
                              (tests/fuzz/corpus_codes.json is made this way and the unit tests
                              check the parser against it).

Usage:
  differential.py --checker BUILD/tests/fuzz/header_check --count 20000 --seed 1 [--keep DIR]
  differential.py --checker BUILD/tests/fuzz/header_check --dir DIR   (compare on existing files,
                              e.g. a corpus the fuzzer has grown)
  differential.py --reference-codes tests/fuzz/corpus/header tests/fuzz/corpus_codes.json

Exit status 1 when a mismatch is found (they are saved under --keep, default ./differential-out).
Accepted differences: INVALID_HEADER whose message says "stricter than the reference" (a tensor
name given twice, a tensor written as an array, a dtype written as {"NAME": null}; see
src/safetensors/header_sax.hpp).
"""
import argparse
import json
import os
import random
import struct
import subprocess
import sys
import tempfile

from safetensors import safe_open

DTYPES = {"BOOL": 8, "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6, "U8": 8, "I8": 8, "F8_E5M2": 8,
          "F8_E4M3": 8, "F8_E8M0": 8, "F8_E4M3FNUZ": 8, "F8_E5M2FNUZ": 8, "I16": 16, "U16": 16,
          "F16": 16, "BF16": 16, "I32": 32, "U32": 32, "F32": 32, "C64": 64, "F64": 64, "I64": 64,
          "U64": 64}

# The reference's Display strings (safetensors/src/tensor.rs), after "Error while deserializing
# header: ".
PREFIXES = [
    ("header too small", "HEADER_TOO_SMALL"),
    ("header too large", "HEADER_TOO_LARGE"),
    ("invalid header length", "INVALID_HEADER_LENGTH"),
    ("invalid UTF-8 in header", "INVALID_HEADER_UTF8"),
    ("invalid JSON in header", "INVALID_HEADER"),
    ("invalid offset for tensor", "INVALID_OFFSET"),
    ("overflow computing buffer size", "VALIDATION_OVERFLOW"),
    ("The slice is slicing for subbytes", "MISALIGNED_SLICE"),
    ("invalid shape, data type, or offset", "TENSOR_INVALID_INFO"),
    ("incomplete metadata", "METADATA_INCOMPLETE_BUFFER"),
]


def reference_code(path):
    try:
        with safe_open(path, framework="np"):
            return "OK"
    except Exception as error:  # SafetensorError
        message = str(error)
        message = message.split("Error while deserializing header: ", 1)[-1]
        for prefix, code in PREFIXES:
            if message.startswith(prefix):
                return code
        return "UNKNOWN: " + message


def file_bytes(header, data_len):
    return struct.pack("<Q", len(header)) + header + b"\0" * data_len


# ---- generators -------------------------------------------------------------------------------

def rand_name(rng):
    pool = ["w", "a.b", "", "__metadata__", "x" * 40, "é", "\\u0041", "\\\"q", "t\\n", "z"]
    return rng.choice(pool) + str(rng.randint(0, 3))


def rand_number_token(rng):
    choices = [
        lambda: str(rng.randint(0, 10)),
        lambda: str(rng.choice([2**63, 2**64 - 1, 2**64, 2**64 + 1, 2**65, 10**20])),
        lambda: "-" + str(rng.randint(0, 5)),
        lambda: rng.choice(["1.0", "0.5", "1e0", "1E2", "-0", "0e0", "1e-400", "4.0"]),
        lambda: rng.choice(["1.7976931348623157", "1.7976931348623158", "1.7976931348623159",
                            "1.797693134862315808", "1.79769313486231570815", "17976931348623157",
                            "179769313486231580"]) + "e" + str(rng.choice([290, 291, 292, 300, 307, 308, 309])),
        lambda: str(rng.randint(1, 10**rng.randint(1, 40))) + "." + str(rng.randint(0, 10**rng.randint(1, 30))) + "e" + rng.choice(["", "+", "-"]) + str(rng.randint(250, 330)),
        lambda: "9" * rng.randint(300, 320),
        lambda: "1" + "0" * rng.randint(300, 320) + rng.choice(["", ".5", "e-5", "e-20"]),
        lambda: rng.choice(["0e2147483648", "1e2147483648", "1e-2147483648", "0.0000e99999999999"]),
    ]
    return rng.choice(choices)()


def rand_json(rng, depth=0):
    kind = rng.randint(0, 7 if depth < 4 else 4)
    if kind == 0:
        return "null"
    if kind == 1:
        return rng.choice(["true", "false"])
    if kind == 2:
        return rand_number_token(rng)
    if kind == 3:
        return '"' + rng.choice(["s", "", "\\u00e9", "\\ud83d\\ude00", "é"]) + '"'
    if kind == 4:
        d = rng.choice([1, 2, 120, 124, 125, 126, 127, 128, 200])
        return "[" * d + "]" * d
    if kind == 5:
        return "[" + ",".join(rand_json(rng, depth + 1) for _ in range(rng.randint(0, 3))) + "]"
    return "{" + ",".join('"k%d":%s' % (i, rand_json(rng, depth + 1)) for i in range(rng.randint(0, 3))) + "}"


def dtype_json(rng, name):
    r = rng.random()
    if r < 0.8:
        return '"%s"' % name
    if r < 0.9:
        return '{"%s":null}' % name
    return rng.choice(['"%s"' % name.lower(), '{"%s":{}}' % name, '{}', '{"%s":null,"F32":null}' % name,
                       "null", "5", '["%s"]' % name])


def structured_case(rng):
    """A random header that is valid more often than not, with one or two things off."""
    count = rng.randint(0, 5)
    tensors = []
    offset = 0
    for i in range(count):
        dtype = rng.choice(list(DTYPES))
        shape = [rng.choice([0, 1, 2, 3, 4]) for _ in range(rng.randint(0, 3))]
        elements = 1
        for d in shape:
            elements *= d
        bits = elements * DTYPES[dtype]
        size = bits // 8
        r = rng.random()
        if r < 0.05:
            shape = [rng.choice([2**63, 2**64 - 1, 2**62, 2**61 + 1]), rng.choice([2, 3, 4])]
        elif r < 0.1:
            size += rng.choice([-1, 1])
        begin = offset
        if rng.random() < 0.05:
            begin += rng.choice([-1, 1, 4])
        end = begin + size
        if rng.random() < 0.03:
            end = begin - 1
        offset = end if end >= 0 else 0
        tensors.append((rng.choice(["t%d" % i, rand_name(rng)]), dtype, shape, [begin, end]))
    rng.shuffle(tensors)
    entries = []
    if rng.random() < 0.3:
        value = rng.choice(['{"format":"pt"}', "{}", "null", '{"a":"1","a":"2"}', '{"a":1}', "[]",
                            '{"k":"v","k2":"\\u0000"}'])
        entries.append('"__metadata__":' + value)
        if rng.random() < 0.05:
            entries.append('"__metadata__":null')
    for name, dtype, shape, offsets in tensors:
        shape_s = "[" + ",".join(map(str, shape)) + "]"
        off_s = "[%d,%d]" % tuple(offsets) if min(offsets) >= 0 else "[%d,%d]" % tuple(offsets)
        if rng.random() < 0.08:
            off_s = rng.choice(["[0]", "[0,0,0]", "{}", "[0.0,0]", "[-0,0]"])
        if rng.random() < 0.1:
            entries.append('"%s":[%s,%s,%s]' % (name, dtype_json(rng, dtype), shape_s, off_s))
            continue
        fields = ['"dtype":' + dtype_json(rng, dtype), '"shape":' + shape_s, '"data_offsets":' + off_s]
        if rng.random() < 0.3:
            fields.append('"extra":' + rand_json(rng))
        if rng.random() < 0.03:
            fields.append(rng.choice(fields))
        if rng.random() < 0.03:
            fields.pop(rng.randrange(len(fields)))
        rng.shuffle(fields)
        entries.append('"%s":{%s}' % (name, ",".join(fields)))
    ws = lambda: rng.choice(["", "", " ", "\t\n", "\r", "\x0c", "\x00", "\xef\xbb\xbf"]) if rng.random() < 0.2 else ""
    header = (ws() + "{" + ",".join(entries) + "}" + ws()).encode("utf-8", "surrogatepass")
    pad = (-len(header)) % 8 if rng.random() < 0.7 else 0
    header += b" " * pad
    data_len = offset
    r = rng.random()
    if r < 0.05:
        data_len += 1
    elif r < 0.1 and data_len > 0:
        data_len -= 1
    return file_bytes(header, data_len)


def mutate(rng, raw):
    raw = bytearray(raw)
    for _ in range(rng.randint(1, 3)):
        op = rng.randint(0, 3)
        pos = rng.randrange(8, len(raw)) if len(raw) > 8 else 0
        if op == 0 and raw:
            raw[pos] = rng.randrange(256)
        elif op == 1:
            raw.insert(pos, rng.choice(b'{}[]",:0123456789-.eE \t\x00\xc3\xa9\xed\xa0\x80\xf4\x90'))
        elif op == 2 and len(raw) > 8:
            del raw[pos]
        else:
            # keep the length prefix consistent with a shifted header so the JSON gets parsed
            n = struct.unpack("<Q", bytes(raw[:8]))[0] if len(raw) >= 8 else 0
            delta = rng.choice([-1, 1])
            if 0 <= n + delta <= len(raw):
                raw[:8] = struct.pack("<Q", n + delta)
    return bytes(raw)


HANDWRITTEN = [
    (b'{"t":["F32",[1],[0,4]]}', 4), (b'{"t":[{"F32":null},[1],[0,4]]}', 4),
    (b'{"t":{"dtype":{"F32":null},"shape":[1],"data_offsets":[0,4]}}', 4),
    (b'{"t":{"dtype":{"F32":{}},"shape":[1],"data_offsets":[0,4]}}', 4),
    (b'\xef\xbb\xbf{}', 0), (b'{"__metadata__":null,"__metadata__":null}', 0),
    (b'{"\\u005f_metadata__":{"a":"b"}}', 0), (b'{}\x00', 0), (b'\x0c{}', 0),
    (b'{"t":{"dtype":"F32","shape":[-0],"data_offsets":[0,0]}}', 0),
    (b'{"t":{"dtype":"F4","shape":[],"data_offsets":[0,0]}}', 0),
    (b'{"a":"\\ud800"}', 0), (b'{"a":"\\udc00"}', 0), (b'{"a":"\x7f"}', 0), (b'{"a":"\x1f"}', 0),
    (b'{"t":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"u":"\\ud83d\\ude00\\/"}}', 4),
    (b'{"t":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"u":01}}', 4),
    (b'{"t":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"u":1.}}', 4),
    (b'{"t":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"u":NaN}}', 4),
    (b'{"t":{"dtype":"F32","shape":[1],"data_offsets":[0,4],}}', 4),
    (b'{"t":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}/**/}', 4),
]


def run_checker(checker, paths):
    out = subprocess.run([checker] + paths, capture_output=True, check=False)
    result = {}
    for line in out.stdout.decode("utf-8", "replace").splitlines():
        path, code, message = line.split("\t", 2)
        result[path] = (code, message)
    missing = [p for p in paths if p not in result]
    if out.returncode != 0 or missing:
        raise SystemExit("header_check failed (exit %d) on %s\n%s" % (out.returncode, missing[:3], out.stderr.decode()))
    return result


def load_dir(directory):
    cases = []
    for name in sorted(os.listdir(directory)):
        path = os.path.join(directory, name)
        if os.path.isfile(path):
            with open(path, "rb") as f:
                cases.append(f.read())
    return cases


def differential(args):
    rng = random.Random(args.seed)
    if args.dir:
        cases = load_dir(args.dir)
        if args.reframe:
            # As the fuzzer's second mode does: the bytes after the prefix are the header, here
            # framed with the right length and followed by as many data bytes as the prefix said
            # modulo 4096, so that both the JSON and the size checks get exercised.
            cases = [file_bytes(c[8:], struct.unpack("<Q", c[:8])[0] % 4096) for c in cases if len(c) >= 8]
        return compare(args, cases)
    cases = [file_bytes(h, d) for h, d in HANDWRITTEN]
    valid_pool = []
    while len(cases) < args.count:
        r = rng.random()
        if r < 0.6 or not valid_pool:
            case = structured_case(rng)
        else:
            case = mutate(rng, rng.choice(valid_pool))
        cases.append(case)
        if len(valid_pool) < 200 and rng.random() < 0.2:
            valid_pool.append(case)
    return compare(args, cases)


def compare(args, cases):
    os.makedirs(args.keep, exist_ok=True)
    mismatches = 0
    seen = {}
    with tempfile.TemporaryDirectory() as tmp:
        for start in range(0, len(cases), 500):
            paths = []
            for i, case in enumerate(cases[start:start + 500], start):
                path = os.path.join(tmp, "case%06d.safetensors" % i)
                with open(path, "wb") as f:
                    f.write(case)
                paths.append(path)
            ours = run_checker(args.checker, paths)
            for path in paths:
                expected = reference_code(path)
                code, message = ours[path]
                seen[expected] = seen.get(expected, 0) + 1
                if code == expected or (code == "INVALID_HEADER" and "stricter than the reference" in message):
                    continue
                # Tensors with equal data_offsets are validated in HashMap order by the reference,
                # which differs from one open to the next; any code it can give is right.
                possible = {reference_code(path) for _ in range(40)}
                if code in possible:
                    continue
                mismatches += 1
                kept = os.path.join(args.keep, os.path.basename(path))
                with open(path, "rb") as src, open(kept, "wb") as dst:
                    dst.write(src.read())
                print("MISMATCH %s: reference %s, peft_c %s (%s)" % (kept, "/".join(sorted(possible)), code, message))
    print("reference results: " + ", ".join("%s %d" % kv for kv in sorted(seen.items())))
    print("%d cases, %d mismatches" % (len(cases), mismatches))
    return 1 if mismatches else 0


def reference_codes(directory, out_path):
    codes = {}
    for name in sorted(os.listdir(directory)):
        path = os.path.join(directory, name)
        if os.path.isfile(path):
            codes[name] = reference_code(path)
    with open(out_path, "w") as f:
        json.dump(codes, f, indent=1, sort_keys=True)
        f.write("\n")
    print("%d files -> %s" % (len(codes), out_path))
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checker")
    parser.add_argument("--count", type=int, default=5000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--keep", default="differential-out")
    parser.add_argument("--dir", help="compare on the files of this directory instead of generated ones")
    parser.add_argument("--reframe", action="store_true",
                        help="with --dir: take bytes 8.. of each file as the header and fix the length")
    parser.add_argument("--reference-codes", nargs=2, metavar=("DIR", "OUT"))
    args = parser.parse_args()
    if args.reference_codes:
        return reference_codes(*args.reference_codes)
    if not args.checker:
        parser.error("--checker is required")
    return differential(args)


if __name__ == "__main__":
    sys.exit(main())
