"""The error codes of peft_c and the exception hierarchy built from them.

``ERROR_CODES`` mirrors the ``PEFT_ERR_*`` constants of ``include/peft_c.h`` (a test parses the header
and checks that the two agree). One exception class is generated per code; each also derives from the
built-in exception a Python programmer would reach for (a missing tensor is a ``KeyError``, a bad
argument a ``ValueError``, a failed system call an ``OSError``), so ordinary ``except`` clauses work.
"""

from __future__ import annotations

import enum
from typing import Dict, Optional, Tuple, Type

# (code, NAME as in PEFT_ERR_NAME). Values are stable: the header never renumbers them.
ERROR_CODES: Tuple[Tuple[int, str], ...] = (
    (1, "HEADER_TOO_SMALL"),
    (2, "HEADER_TOO_LARGE"),
    (3, "INVALID_HEADER_LENGTH"),
    (4, "INVALID_HEADER_UTF8"),
    (5, "INVALID_HEADER"),
    (6, "INVALID_OFFSET"),
    (7, "VALIDATION_OVERFLOW"),
    (8, "MISALIGNED_SLICE"),
    (9, "TENSOR_INVALID_INFO"),
    (10, "METADATA_INCOMPLETE_BUFFER"),
    (20, "IO"),
    (21, "NOT_FOUND"),
    (22, "UNSUPPORTED"),
    (23, "UNRESOLVED_KEY"),
    (24, "SHAPE_MISMATCH"),
    (25, "INVALID_ARGUMENT"),
    (26, "OUT_OF_MEMORY"),
    (27, "CANCELLED"),
    (28, "INVALID_CONFIG"),
    (29, "INVALID_CHECKPOINT"),
    (30, "OVER_BUDGET"),
    (31, "NON_FINITE"),
    (99, "INTERNAL"),
)

OK = 0

# The codes of malformed safetensors files: the failure kinds of the reference reader.
FORMAT_ERROR_CODES = frozenset(range(1, 11))

ErrorCode = enum.IntEnum("ErrorCode", [("OK", OK)] + [(name, code) for code, name in ERROR_CODES])
ErrorCode.__doc__ = "The stable error codes (PEFT_ERR_*) of peft_c."
ErrorCode.__module__ = "peft_c"


class PeftError(Exception):
    """An error reported by peft_c: a stable ``code``, its ``code_name`` and the library's message.

    ``__str__`` is defined here (and PeftError comes first in every subclass's MRO) so that the
    subclasses that are also ``KeyError`` do not print their message quoted.
    """

    #: The code of this class (None for the base class and for codes unknown to this binding).
    code_value: Optional[int] = None

    def __init__(self, message: str = "", code: Optional[int] = None, code_name: Optional[str] = None):
        super().__init__(message)
        if code is None:
            code = self.code_value if self.code_value is not None else -1
        self.code: int = int(code)
        self.code_name: str = code_name or _NAME_OF_CODE.get(self.code, "UNKNOWN")
        self.message: str = message

    def __str__(self) -> str:
        return f"{self.code_name}: {self.message}"

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.message!r}, code={self.code})"

    def __reduce__(self):
        return (error_from_code, (self.code, self.message, self.code_name))


class SafetensorsFormatError(PeftError, ValueError):
    """A safetensors file that the format (and the reference reader) rejects."""


PeftError.__module__ = "peft_c"
SafetensorsFormatError.__module__ = "peft_c"

# Extra built-in bases for codes that have an obvious Python counterpart.
_BUILTIN_BASE: Dict[str, Type[BaseException]] = {
    "IO": OSError,
    "NOT_FOUND": KeyError,
    "UNSUPPORTED": ValueError,
    "UNRESOLVED_KEY": KeyError,
    "SHAPE_MISMATCH": ValueError,
    "INVALID_ARGUMENT": ValueError,
    "OUT_OF_MEMORY": MemoryError,
    "INVALID_CONFIG": ValueError,
    "INVALID_CHECKPOINT": ValueError,
}

_NAME_OF_CODE: Dict[int, str] = {OK: "OK", **{code: name for code, name in ERROR_CODES}}


def class_name_of(code_name: str) -> str:
    """``"INVALID_OFFSET"`` -> ``"InvalidOffsetError"``."""
    return "".join(part.capitalize() for part in code_name.split("_")) + "Error"


def _make_class(code: int, name: str) -> Type[PeftError]:
    if code in FORMAT_ERROR_CODES:
        bases: Tuple[type, ...] = (SafetensorsFormatError,)
    elif name in _BUILTIN_BASE:
        bases = (PeftError, _BUILTIN_BASE[name])
    else:
        bases = (PeftError,)
    doc = f"peft_c error PEFT_ERR_{name} (code {code})."
    cls = type(class_name_of(name), bases, {"code_value": code, "__doc__": doc, "__module__": "peft_c"})
    return cls


#: Exception class of each code.
ERROR_CLASSES: Dict[int, Type[PeftError]] = {code: _make_class(code, name) for code, name in ERROR_CODES}

# Make every generated class importable by name from this module (and from the package).
globals().update({cls.__name__: cls for cls in ERROR_CLASSES.values()})

def error_from_code(code: int, message: str, code_name: Optional[str] = None) -> PeftError:
    """Builds the exception for ``code`` (the base ``PeftError`` for a code this binding does not know)."""
    cls = ERROR_CLASSES.get(int(code), PeftError)
    return cls(message, code=code, code_name=code_name)


def code_name(code: int) -> str:
    """The name of a code as this binding knows it ("UNKNOWN" for others)."""
    return _NAME_OF_CODE.get(int(code), "UNKNOWN")


__all__ = [
    "ERROR_CODES",
    "ERROR_CLASSES",
    "ErrorCode",
    "PeftError",
    "SafetensorsFormatError",
    "error_from_code",
    "code_name",
] + [cls.__name__ for cls in ERROR_CLASSES.values()]
