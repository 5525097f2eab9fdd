"""The binding's tables against include/peft_c.h and the library; the exception hierarchy."""

from __future__ import annotations

import os
import pickle
import re

import pytest

import peft_c
from peft_c import _errors
from peft_c._lib import check
from peft_c_test_support import HEADER

DEFINE = re.compile(r"^#define\s+(PEFT_[A-Z0-9_]+)\s+(\d+)\b", re.MULTILINE)


def header_constants(prefix: str) -> dict:
    text = HEADER.read_text()
    return {name[len(prefix):]: int(value) for name, value in DEFINE.findall(text) if name.startswith(prefix)}


def test_every_error_code_of_the_header_is_in_the_table():
    from_header = header_constants("PEFT_ERR_")
    assert from_header, "no PEFT_ERR_ constants parsed from the header"
    assert dict((name, code) for code, name in peft_c.ERROR_CODES) == from_header
    assert header_constants("PEFT_")["OK"] == peft_c.ErrorCode.OK == 0


def test_every_dtype_of_the_header_is_in_the_table():
    from_header = header_constants("PEFT_DTYPE_")
    count = from_header.pop("COUNT")
    assert dict((name, value) for value, name, _ in peft_c.DTYPES) == from_header
    assert count == peft_c.DTYPE_COUNT == len(peft_c.DType)


def test_versions_agree_with_header_and_package():
    consts = header_constants("PEFT_")
    header_version = f"{consts['VERSION_MAJOR']}.{consts['VERSION_MINOR']}.{consts['VERSION_PATCH']}"
    assert peft_c.version() == header_version == peft_c.__version__
    assert peft_c.version_number() == (consts["VERSION_MAJOR"] * 10000 + consts["VERSION_MINOR"] * 100
                                       + consts["VERSION_PATCH"])
    assert peft_c.abi_version() == consts["ABI_VERSION"] == peft_c.ABI_VERSION


def test_kernel_table_is_named():
    assert peft_c.kernels() in ("portable", "avx2", "avx512")
    if os.environ.get("PEFT_C_KERNELS") == "portable":
        assert peft_c.kernels() == "portable"


def test_library_names_every_code_as_the_binding_does():
    lib = peft_c._lib.lib()
    for code, name in peft_c.ERROR_CODES:
        assert lib.peft_error_code_name(code).decode() == name
    assert lib.peft_error_code_name(0).decode() == "OK"
    assert lib.peft_error_code_name(12345).decode() == "UNKNOWN"


def test_library_dtype_functions_agree_with_the_table():
    lib = peft_c._lib.lib()
    for value, name, bits in peft_c.DTYPES:
        assert lib.peft_dtype_name(value).decode() == name
        assert lib.peft_dtype_from_name(name.encode()) == value
        assert lib.peft_dtype_bits(value) == bits == peft_c.dtype_bits(name)
    assert lib.peft_dtype_name(peft_c.DTYPE_COUNT) is None
    assert lib.peft_dtype_from_name(b"f32") == -1  # case-sensitive, as the reference
    assert lib.peft_dtype_bits(-1) == 0


@pytest.mark.parametrize("code,name", peft_c.ERROR_CODES)
def test_one_class_per_code(code, name):
    cls = peft_c.ERROR_CLASSES[code]
    assert cls.__name__ == _errors.class_name_of(name)
    assert getattr(peft_c, cls.__name__) is cls
    assert issubclass(cls, peft_c.PeftError)
    err = _errors.error_from_code(code, "message at fault")
    assert type(err) is cls
    assert (err.code, err.code_name, err.message) == (code, name, "message at fault")
    assert str(err) == f"{name}: message at fault"
    clone = pickle.loads(pickle.dumps(err))
    assert type(clone) is cls and clone.code == code and clone.message == err.message


def test_builtin_bases_make_plain_except_clauses_work():
    assert issubclass(peft_c.InvalidOffsetError, peft_c.SafetensorsFormatError)
    assert issubclass(peft_c.InvalidOffsetError, ValueError)
    assert issubclass(peft_c.NotFoundError, KeyError)
    assert issubclass(peft_c.IoError, OSError)
    assert issubclass(peft_c.InvalidArgumentError, ValueError)
    assert issubclass(peft_c.OutOfMemoryError, MemoryError)
    assert not issubclass(peft_c.InternalError, ValueError)
    # KeyError would quote the message; PeftError's __str__ wins.
    assert str(peft_c.NotFoundError("tensor \"x\"")) == 'NOT_FOUND: tensor "x"'


def test_unknown_code_gives_the_base_class():
    err = _errors.error_from_code(77, "from a newer library", "SOMETHING_NEW")
    assert type(err) is peft_c.PeftError
    assert (err.code, err.code_name) == (77, "SOMETHING_NEW")


def test_a_real_error_object_becomes_the_exception():
    lib = peft_c._lib.lib()
    with pytest.raises(peft_c.InvalidArgumentError) as info:
        check(lib.peft_convert(999, None, 17, None, 1))  # unknown dtype
    assert info.value.code == peft_c.ErrorCode.INVALID_ARGUMENT
    assert info.value.message  # the library says what is wrong
    with pytest.raises(peft_c.InvalidArgumentError):
        check(lib.peft_open_options_new(None))


def test_check_accepts_success():
    assert check(None) is None
