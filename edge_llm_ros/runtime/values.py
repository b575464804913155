"""Field values against their ROS types: what each primitive type takes, what it refuses, and the error.

Knows the ROS primitive types, numpy and rosbags' CDR packer; knows nothing of
registries or the wire. A caller gives the field's type, the value and
`where`, the field's path (`Type.field`, `Type.field[3]`, `Type.header.stamp.sec`),
which every error begins with. A value enters a message one of three ways:

- from YAML (`Registry.from_dict`, the command line): `yaml_field`,
  `yaml_list` and `yaml_array` check every value;
- assigned to a numeric array field (every message a node builds): `as_array`
  makes it a numpy array of the field's dtype (`NUMPY_DTYPES`), refusing the
  elements that the cast would change;
- packed by `Registry.serialize`: nothing is checked while the packer takes the
  message; when it fails, `misfit` finds the first field at fault and says why.

What each type takes from YAML, and from an array assignment element by element:

    string, wstring    any scalar, as str()
    bool               true/false (YAML's, or the strings in any case), 1/0; not 'yes', 2 or 0.5
    int8 ... int64,    integers within the type's range, floats without a fraction (4.0) and
    uint8 ... uint64,  numeric strings ('12'); not bools, fractions, nan or inf
    char, octet
    byte               0..255, ROS 2's octet; rosbags packs a scalar byte as int8, so 128..255
                       go to it as -128..-1, the same bits on the wire
    float32, float64   ints, floats and numeric strings within +-FLT_MAX (float32) or +-DBL_MAX;
                       nan and inf are IEEE values and pass

No type takes a mapping, a list or null. An array `T[N]` takes a list (or
array) of exactly N elements, a sequence `T[<=N]` at most N. An array
assignment also takes float rounding (float64 to float32, large integers to
floats). At serialize time numeric arrays must be numpy arrays of exactly the
field's dtype, and a scalar is what rosbags' struct packer takes (a byte there is
int8, -128..127).

Every refusal is an InterfaceError (a ValueError) whose message starts with
`where`; a value out of its type's range reads

    Type.field: VALUE is out of range for int32 [-2147483648, 2147483647]

(float types give their largest finite value as the bounds; an integer past
128 bits is shown by its number of digits). The others read `Type.field[1]: 2.5
is not an integer (int32)`, `expected a number (int32), got 'a'`, `'yes' is not
a bool (true/false or 1/0)`, `expected a value of type uint32, got 2.5`,
`expected a string, got 7`, `expected a numpy array of int32, got [...]`,
`expected a list, got ...`, `expected 36 elements, got 35` and `2 elements, more
than its bound of 1`.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import struct
import sys
from typing import Any

import numpy as np
from rosbags.typesys.base import Nodetype

NUMPY_DTYPES = {
    "bool": np.bool_, "byte": np.uint8, "char": np.uint8, "octet": np.uint8,
    "int8": np.int8, "uint8": np.uint8, "int16": np.int16, "uint16": np.uint16,
    "int32": np.int32, "uint32": np.uint32, "int64": np.int64, "uint64": np.uint64,
    "float32": np.float32, "float64": np.float64,
}

# What rosbags' CDR packer takes for each scalar type (its struct formats; standard
# sizes: a native "f" would turn 1e40 into inf where rosbags' "<f" refuses it).
_PACKERS = {typ: struct.Struct("<" + fmt).pack for typ, fmt in {
    "bool": "?", "byte": "b", "char": "B", "octet": "B", "int8": "b", "uint8": "B", "int16": "h", "uint16": "H",
    "int32": "i", "uint32": "I", "int64": "q", "uint64": "Q", "float32": "f", "float64": "d",
}.items()}
_INT_RANGES = {typ: (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1) for typ, bits in
               {"int8": 8, "int16": 16, "int32": 32, "int64": 64, "byte": 8}.items()}
_INT_RANGES.update({typ: (0, 2**bits - 1) for typ, bits in
                    {"uint8": 8, "uint16": 16, "uint32": 32, "uint64": 64, "char": 8, "octet": 8}.items()})
# ROS 2 defines byte as an octet, 0..255, and so does from_dict; rosbags packs a
# scalar byte field as a signed int8 (byte arrays are uint8), so yaml_field folds
# 128..255 onto -128..-1: the same bits on the wire.
_YAML_INT_RANGES = {**_INT_RANGES, "byte": (0, 255)}
_FLOAT_MAX = {"float32": float(np.finfo(np.float32).max), "float64": sys.float_info.max}
_ARRAY_LIMITS = {np.dtype(typ).type: _INT_RANGES[typ] for typ in ("int8", "int16", "int32", "int64", "uint8", "uint16",
                                                                  "uint32", "uint64")}
_ARRAY_LIMITS[np.float32] = (-_FLOAT_MAX["float32"], _FLOAT_MAX["float32"])


def _has_same_value_cast() -> bool:
    try:
        np.zeros(1, dtype=np.int64).astype(np.int32, casting="same_value")
    except (TypeError, ValueError):  # numpy < 2.4
        return False
    return True


_SAME_VALUE_CAST = _has_same_value_cast()


class InterfaceError(ValueError):
    """An unknown interface, a definition that does not parse, or a value that does not fit its field."""


# ------------------------------------------------------------------ messages
def _show(value: Any) -> str:
    """A value for an error line; an integer far past any field type by its size (str() refuses > 4300 digits)."""
    if isinstance(value, int) and value.bit_length() > 128:
        return f"{'-' if value < 0 else ''}a {int(value.bit_length() * math.log10(2)) + 1}-digit integer"
    return str(value)


def _range_error(where: str, value: Any, typ: str, ranges: dict) -> str:
    lo, hi = ranges[typ] if typ in ranges else (-_FLOAT_MAX[typ], _FLOAT_MAX[typ])
    return f"{where}: {_show(value)} is out of range for {typ} [{lo}, {hi}]"


def _out_of_range(where: str, value: Any, typ: str) -> InterfaceError:
    return InterfaceError(_range_error(where, value, typ, _YAML_INT_RANGES))


# ---------------------------------------------------------------------- YAML
def _number(value: Any, where: str, typ: str) -> int | float:
    """A number from YAML or code: ints and floats as they are, numeric strings parsed, bools and the rest refused."""
    if isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_)):
        return int(value)
    if isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_)):
        return float(value)
    if isinstance(value, str):
        for parse in (int, float):
            try:
                return parse(value)
            except ValueError:
                pass
    raise InterfaceError(f"{where}: expected a number ({typ}), got {value!r}")


def _yaml_int(typ: str, value: Any, where: str) -> int:
    number = _number(value, where, typ)
    if isinstance(number, float):
        if not number.is_integer():
            raise InterfaceError(f"{where}: {value!r} is not an integer ({typ})")
        number = int(number)
    lo, hi = _YAML_INT_RANGES[typ]
    if not lo <= number <= hi:
        raise _out_of_range(where, number, typ)
    return number


def _yaml_float(typ: str, value: Any, where: str) -> float:
    number = _number(value, where, typ)
    try:
        number = float(number)
        _PACKERS[typ](number)  # nan and inf pack; finite values past the type's largest do not
    except OverflowError:
        raise _out_of_range(where, value, typ) from None
    return number


def _yaml_bool(value: Any, where: str) -> bool:
    """true/false (YAML's, or the strings), or 1/0; 'yes', 2 and 0.5 are not bools."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, numbers.Integral) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    shown = repr(value) if isinstance(value, str) else _show(value)
    raise InterfaceError(f"{where}: {shown} is not a bool (true/false or 1/0)")


def _yaml_scalar(typ: str, value: Any, where: str) -> Any:
    """A scalar value from YAML, checked against the type `typ`."""
    if isinstance(value, (dict, list)) or value is None:
        raise InterfaceError(f"{where}: expected a value of type {typ}, got {value!r}")
    if typ in ("string", "wstring"):
        return str(value)
    if typ == "bool":
        return _yaml_bool(value, where)
    if typ in _FLOAT_MAX:
        return _yaml_float(typ, value, where)
    return _yaml_int(typ, value, where)


def yaml_field(typ: str, value: Any, where: str) -> Any:
    """A scalar field's value from YAML, checked against `typ`, as rosbags packs it (see _YAML_INT_RANGES)."""
    value = _yaml_scalar(typ, value, where)
    return value - 256 if typ == "byte" and value > 127 else value


def yaml_list(kind: Nodetype, size: int, value: Any, where: str) -> None:
    """Refuse a YAML value for an array (`size` elements) or sequence (bound `size`, 0: none) that is no such list."""
    if not isinstance(value, (list, tuple, np.ndarray)):
        raise InterfaceError(f"{where}: expected a list, got {value!r}")
    if kind == Nodetype.ARRAY and len(value) != size:
        raise InterfaceError(f"{where}: expected {size} elements, got {len(value)}")
    if kind == Nodetype.SEQUENCE and size and len(value) > size:
        raise InterfaceError(f"{where}: {len(value)} elements, more than its bound of {size}")


def yaml_array(typ: str, value: Any, where: str) -> Any:
    """The elements of a YAML list for a `typ[]` field, each checked: a numpy array for numeric types, else a list."""
    items = [_yaml_scalar(typ, v, f"{where}[{i}]") for i, v in enumerate(value)]
    dtype = NUMPY_DTYPES.get(typ)
    return items if dtype is None else np.array(items, dtype=dtype)


# ---------------------------------------------------------------- assignment
def as_array(value: Any, dtype: type, where: str) -> np.ndarray:
    """`value` as a 1-D `dtype` array, refusing the elements that numpy's cast would wrap, truncate or overflow.

    This runs on every message a node builds, so the common cases are checked
    on the whole array (_cast_exactly); the rest goes element by element,
    which also names the element at fault.
    """
    try:
        array = np.asarray(value).reshape(-1)
    except (TypeError, ValueError) as exc:
        raise InterfaceError(f"{where}: cannot make an array of {np.dtype(dtype).name} from {value!r} ({exc})") from None
    if array.dtype == dtype:
        return array
    cast = _cast_exactly(array, dtype) if array.size else array.astype(dtype)
    if cast is not None:
        return cast
    typ = "bool" if dtype is np.bool_ else np.dtype(dtype).name
    return np.array([_yaml_scalar(typ, v, f"{where}[{i}]") for i, v in enumerate(array.tolist())], dtype=dtype)


def _cast_exactly(array: np.ndarray, dtype: type) -> np.ndarray | None:
    """`array` cast to `dtype` if that changes no value but by float rounding; None: some may change, look at each."""
    kind = array.dtype.kind
    if kind == "b":
        return array.astype(dtype)
    if kind not in "iuf" or dtype is np.bool_:  # objects (ints past 64 bits), strings; numbers to bools
        return None
    if dtype is np.float64 or (dtype is np.float32 and kind in "iu"):
        return array.astype(dtype)
    lo, hi = _ARRAY_LIMITS[dtype]
    if dtype is np.float32:  # float64 -> float32 overflows past +-FLT_MAX (nan and inf are looked at one by one)
        fits = bool(lo <= np.minimum.reduce(array)) and bool(np.maximum.reduce(array) <= hi)
        return array.astype(dtype) if fits else None
    if _SAME_VALUE_CAST:  # numpy >= 2.4 checks integer casts in the cast itself
        try:
            return array.astype(dtype, casting="same_value")
        except ValueError:
            return None
    if kind == "f":  # fractions, nan, inf
        return None
    fits = lo <= int(np.minimum.reduce(array)) and int(np.maximum.reduce(array)) <= hi
    return array.astype(dtype) if fits else None


# ----------------------------------------------------------------- serialize
def misfit(fielddefs: dict, name: str, msg: Any, where: str) -> str | None:
    """Why the packer refuses `msg` as a `name` (fields as in rosbags' `fielddefs`): the first field at fault, or None."""
    if not dataclasses.is_dataclass(msg):
        return f"{where}: expected a {name} message, got {msg!r}"
    for fname, (kind, detail) in fielddefs[name][1]:
        value = getattr(msg, fname, None)
        at = f"{where}.{fname}"
        if kind == Nodetype.BASE:
            problem = _scalar_misfit(detail[0], value, at)
        elif kind == Nodetype.NAME:
            problem = misfit(fielddefs, detail, value, at)
        else:
            problem = _array_misfit(fielddefs, kind, detail, value, at)
        if problem:
            return problem
    return None


def _array_misfit(fielddefs: dict, kind: Nodetype, detail: tuple, value: Any, where: str) -> str | None:
    (ekind, edetail), size = detail
    dtype = NUMPY_DTYPES.get(edetail[0]) if ekind == Nodetype.BASE else None
    if dtype is not None and not (isinstance(value, np.ndarray) and value.dtype == dtype):
        return f"{where}: expected a numpy array of {np.dtype(dtype).name}, got {value!r}"
    if not isinstance(value, (list, tuple, np.ndarray)):
        return f"{where}: expected a list, got {value!r}"
    if kind == Nodetype.ARRAY and len(value) != size:
        return f"{where}: expected {size} elements, got {len(value)}"
    if dtype is not None:
        return None
    for i, item in enumerate(value):
        at = f"{where}[{i}]"
        problem = (_scalar_misfit(edetail[0], item, at) if ekind == Nodetype.BASE
                   else misfit(fielddefs, edetail, item, at))
        if problem:
            return problem
    return None


def _scalar_misfit(typ: str, value: Any, where: str) -> str | None:
    """Why the CDR packer refuses `value` for a scalar `typ` field, or None when it takes it."""
    if typ in ("string", "wstring"):
        return None if isinstance(value, str) else f"{where}: expected a string, got {value!r}"
    try:
        _PACKERS[typ](value)
        return None
    except (struct.error, OverflowError, TypeError, ValueError):  # ValueError: an array where a scalar goes
        pass
    if isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_)) and (
            typ in _FLOAT_MAX or isinstance(value, numbers.Integral)):
        return _range_error(where, value, typ, _INT_RANGES)
    return f"{where}: expected a value of type {typ}, got {value!r}"
