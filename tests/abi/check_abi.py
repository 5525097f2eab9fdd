"""ABI guard. Fails when:
- a function declared in include/peft_c.h is missing from the peft_api table, or its table entry has
  another signature;
- the table is not an append-only extension of the committed baseline of this ABI version (an entry
  removed, moved or retyped);
- the shared library exports anything but the header's functions, or lacks one of them.

usage: check_abi.py HEADER LIBRARY BASELINE
"""
import os
import re
import subprocess
import sys


def norm(text):
    text = " ".join(text.split())
    text = re.sub(r"\s*([*(),])\s*", r"\1", text)
    return text


def declared_functions(header):
    protos = re.findall(r"^PEFT_API\s+([^;]*?)\s*\b(peft_\w+)\s*\(([^;]*?)\);", header, re.M | re.S)
    return {name: (norm(ret), norm(args)) for ret, name, args in protos}


def table_entries(header):
    body = re.search(r"typedef struct peft_api \{(.*?)\} peft_api;", header, re.S)
    if not body:
        sys.exit("peft_api table not found in the header")
    entries = re.findall(r"^\s*([^;/]*?)\s*\(\*(\w+)\)\s*\(([^;]*?)\);", body.group(1), re.M | re.S)
    return [("peft_" + name, (norm(ret), norm(args))) for ret, name, args in entries]


def main():
    header_path, library, baseline_path = sys.argv[1:4]
    header = open(header_path, encoding="utf-8").read()
    declared = declared_functions(header)
    table = table_entries(header)
    problems = []

    table_names = [name for name, _ in table]
    for name, signature in table:
        if name not in declared:
            problems.append(f"table entry {name} is not declared in the header")
        elif declared[name] != signature:
            problems.append(f"table entry {name} has signature {signature}, header says {declared[name]}")
    for name in declared:
        if name != "peft_get_api" and name not in table_names:
            problems.append(f"{name} is declared but missing from the peft_api table (append it at the end)")

    baseline = []
    for line in open(baseline_path, encoding="utf-8"):
        line = line.rstrip("\n")
        if line and not line.startswith("#"):
            name, ret, args = line.split("|")
            baseline.append((name, (ret, args)))
    for position, (name, signature) in enumerate(baseline):
        if position >= len(table):
            problems.append(f"baseline entry {position} ({name}) was removed from the table")
        elif table[position] != (name, signature):
            problems.append(f"table entry {position} is {table[position]}, the released baseline has {(name, signature)}")
    added = table[len(baseline):]

    nm = subprocess.run([os.environ.get("NM", "nm"), "-D", "--defined-only", library], check=True, capture_output=True, text=True)
    exported = {fields[2] for fields in (line.split() for line in nm.stdout.splitlines())
                if len(fields) == 3 and fields[1] in "TDBRWVi"}
    exported -= {"_init", "_fini", "_edata", "_end", "__bss_start"}
    for name in sorted(set(declared) - exported):
        problems.append(f"{name} is declared but not exported")
    for name in sorted(exported - set(declared)):
        problems.append(f"{name} is exported but not declared in the header")

    for problem in problems:
        print("ABI:", problem)
    print(f"{len(declared)} functions declared, {len(table)} in the table, {len(baseline)} in the baseline, "
          f"{len(added)} appended since: {', '.join(n for n, _ in added) or 'none'}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
