"""The drift check of the Python binding: the ctypes prototypes of ``peft_c._lib.PROTOTYPES`` against the
``PEFT_API`` prototypes of include/peft_c.h. Every declared function must be in the header with as many
parameters and compatible types; every header function must be declared or listed in ``NOT_WRAPPED``.
"""

from __future__ import annotations

import ctypes
import re
from typing import Dict, List, Tuple

from peft_c._lib import PROGRESS_FN, PROTOTYPES, SOURCE_FN, RegistryStatsStruct, SwapStatsStruct
from peft_c_test_support import HEADER

#: Header functions the binding does not declare, and why.
NOT_WRAPPED = {
    "peft_writer_add_tensor_n": "names hold no NUL byte here: add_tensor takes them NUL-terminated",
    "peft_writer_tensor_name_length": "writer tensor names are read NUL-terminated (see add_tensor_n)",
    "peft_get_api": "the function table is for C callers that load the library by hand; ctypes binds by name",
    # Older aliases the header keeps beside the regular names (see its Conventions).
    "peft_lease_release": "older alias of peft_lease_free; the binding calls the regular one",
    "peft_merge_buffer_remove": "older alias of peft_merge_record_unmerge; the binding calls the regular one",
    "peft_registry_names": "older alias of peft_registry_name_list; the binding calls the regular one",
    "peft_translator_builtin_families": "older alias of peft_translator_builtin_family_list; the binding calls "
                                        "the regular one",
}

#: A C prototype: the return type and parameter types, ``const`` and spaces removed ("peft_lease**").
Prototype = Tuple[str, List[str]]

_SCALARS = {
    "int32_t": ctypes.c_int32, "uint32_t": ctypes.c_uint32, "int64_t": ctypes.c_int64,
    "uint64_t": ctypes.c_uint64, "double": ctypes.c_double, "size_t": ctypes.c_size_t,
}
_CALLBACKS = {"peft_tensor_source_fn": SOURCE_FN, "peft_progress_fn": PROGRESS_FN}
_STRUCTS = {"peft_registry_stats": RegistryStatsStruct, "peft_swap_stats": SwapStatsStruct}


def _normalize(c_type: str) -> str:
    return re.sub(r"\s+", "", re.sub(r"\bconst\b", "", c_type))


def parse_header(text: str) -> Dict[str, Prototype]:
    """The ``PEFT_API`` prototypes of a header's text, by function name."""
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    text = re.sub(r"//[^\n]*", " ", text)
    code = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    prototypes = {}
    for statement in code.split(";"):
        match = re.search(r"PEFT_API\s+(.+?)\b(peft_\w+)\s*\((.*)\)\s*$", statement, re.S)
        if not match:
            continue
        params = [p.strip() for p in match.group(3).split(",")]
        if params in (["void"], [""]):
            params = []
        prototypes[match.group(2)] = (_normalize(match.group(1)),
                                      [_normalize(re.sub(r"\b\w+$", "", p)) for p in params])
    return prototypes


def matches(c_type: str, declared) -> bool:
    """Whether a C type (normalized) and the ctypes type declared for it agree."""
    if c_type == "void":
        return declared is None
    if c_type in _SCALARS:
        return declared is _SCALARS[c_type]
    if c_type in _CALLBACKS:
        return declared is _CALLBACKS[c_type]
    if not c_type.endswith("*"):
        return False
    pointee = c_type[:-1]
    if declared is ctypes.c_void_p:  # any pointer: a handle, a buffer, a string freed by the library
        return True
    if declared is ctypes.c_char_p:
        return pointee == "char"
    if isinstance(declared, type) and issubclass(declared, ctypes._Pointer):
        target = declared._type_
        if pointee in _STRUCTS:
            return target is _STRUCTS[pointee]
        return matches(pointee, target)
    return False


def compare(header: Dict[str, Prototype], declared: Dict[str, tuple], not_wrapped: Dict[str, str]) -> List[str]:
    """Every difference between the header and ``declared`` (name -> (restype, argtypes))."""
    problems = []
    for name, (restype, argtypes) in declared.items():
        if name not in header:
            problems.append(f"{name} is declared but not in the header")
            continue
        ret, params = header[name]
        if len(argtypes) != len(params):
            problems.append(f"{name}: {len(argtypes)} parameters declared, {len(params)} in the header")
            continue
        if not matches(ret, restype):
            problems.append(f"{name}: returns {restype}, the header {ret}")
        for i, (c_type, arg) in enumerate(zip(params, argtypes)):
            if not matches(c_type, arg):
                problems.append(f"{name} parameter {i}: {arg}, the header {c_type}")
    for name in header:
        if name not in declared and name not in not_wrapped:
            problems.append(f"{name} is in the header but neither declared nor listed as not wrapped")
    for name in not_wrapped:
        if name in declared:
            problems.append(f"{name} is declared and also listed as not wrapped")
        if name not in header:
            problems.append(f"{name} is listed as not wrapped but not in the header")
    return problems


def test_prototypes_match_the_header():
    header = parse_header(HEADER.read_text())
    # The parser must have found the API, or the comparison would prove nothing.
    assert len(header) >= 140, f"only {len(header)} prototypes parsed from {HEADER}"
    problems = compare(header, PROTOTYPES, NOT_WRAPPED)
    assert not problems, f"{len(problems)} difference(s):\n  " + "\n  ".join(problems)


def test_checker_notices_differences():
    sample = """
        #define PEFT_X 1
        typedef struct peft_registry peft_registry; /* a comment; with a semicolon */
        PEFT_API uint32_t peft_version_number(void);
        PEFT_API peft_error* peft_registry_trim(peft_registry* registry);
        PEFT_API peft_error* peft_registry_get_stats(const peft_registry* registry,
                                                     peft_registry_stats* stats);
        PEFT_API const char* peft_only_in_the_header(const char* const* keys, size_t n);
        PEFT_API const uint64_t* peft_shape(const peft_registry* registry);
    """
    header = parse_header(sample)
    assert sorted(header) == ["peft_only_in_the_header", "peft_registry_get_stats", "peft_registry_trim",
                              "peft_shape", "peft_version_number"]
    assert header["peft_only_in_the_header"] == ("char*", ["char**", "size_t"])
    wrong = {
        "peft_version_number": (ctypes.c_int32, []),  # uint32_t
        "peft_registry_trim": (ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_int32]),  # one parameter
        "peft_registry_get_stats": (ctypes.c_void_p, [ctypes.c_void_p, ctypes.POINTER(SwapStatsStruct)]),
        "peft_shape": (ctypes.POINTER(ctypes.c_double), [ctypes.c_void_p]),  # uint64_t*
        "peft_no_such_function": (None, []),
    }
    problems = compare(header, wrong, {})
    # the return of peft_version_number and of peft_shape, peft_registry_trim's count, the stats struct,
    # peft_no_such_function extra, peft_only_in_the_header missing
    assert len(problems) == 6, problems
    assert not [p for p in compare(header, wrong, {"peft_only_in_the_header": "test"})
                if "peft_only_in_the_header" in p]
