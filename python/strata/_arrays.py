"""Tensors and numpy arrays as raw memory for the native module.

Save: each array becomes ``(name, dtype, shape, (address, length, device))``
where the address is the array's own memory (no copy; a non-contiguous
array is made contiguous once), kept referenced by the caller until the
native call returns. Load: arrays are allocated here with the stored dtype
and shape, and the native module restores into their memory.
"""

from __future__ import annotations

import ctypes
from typing import Any, List, Optional, Tuple

from ._errors import InvalidError

# torch dtype name -> Strata (safetensors) dtype name.
TORCH_TO_STRATA = {
    "float64": "F64",
    "float32": "F32",
    "float16": "F16",
    "bfloat16": "BF16",
    "float8_e4m3fn": "F8_E4M3",
    "float8_e5m2": "F8_E5M2",
    "int64": "I64",
    "int32": "I32",
    "int16": "I16",
    "int8": "I8",
    "uint64": "U64",
    "uint32": "U32",
    "uint16": "U16",
    "uint8": "U8",
    "bool": "BOOL",
}
STRATA_TO_TORCH = {v: k for k, v in TORCH_TO_STRATA.items()}

# numpy dtype (kind, itemsize) -> Strata dtype name.
NUMPY_TO_STRATA = {
    ("f", 8): "F64",
    ("f", 4): "F32",
    ("f", 2): "F16",
    ("i", 8): "I64",
    ("i", 4): "I32",
    ("i", 2): "I16",
    ("i", 1): "I8",
    ("u", 8): "U64",
    ("u", 4): "U32",
    ("u", 2): "U16",
    ("u", 1): "U8",
    ("b", 1): "BOOL",
}
STRATA_TO_NUMPY = {
    "F64": "float64",
    "F32": "float32",
    "F16": "float16",
    "I64": "int64",
    "I32": "int32",
    "I16": "int16",
    "I8": "int8",
    "U64": "uint64",
    "U32": "uint32",
    "U16": "uint16",
    "U8": "uint8",
    "BOOL": "bool",
}


def torch_dtype_name(dtype: Any) -> str:
    return str(dtype).replace("torch.", "")


def torch_entry(name: str, t: Any, where: str) -> Tuple[tuple, Any]:
    """The entry of a torch tensor, and the object to keep alive."""
    import torch

    if t.layout != torch.strided:
        raise InvalidError(f"{where}: {t.layout} tensors are not supported (convert to dense)")
    if t.is_quantized or t.is_complex() or getattr(t, "is_nested", False):
        raise InvalidError(f"{where}: {t.dtype} tensors of this kind are not supported")
    dname = torch_dtype_name(t.dtype)
    sd = TORCH_TO_STRATA.get(dname)
    if sd is None:
        raise InvalidError(f"{where}: dtype {t.dtype} is not supported")
    t = t.detach()
    if t.device.type not in ("cpu", "cuda"):
        t = t.cpu()
    if not t.is_contiguous():
        t = t.contiguous()
    shape = [int(d) for d in t.shape]
    nbytes = t.numel() * t.element_size()
    device = t.device.index if t.device.type == "cuda" else None
    if device is None and t.device.type == "cuda":
        device = torch.cuda.current_device()
    return (name, sd, shape, (int(t.data_ptr()), nbytes, device)), t


def numpy_entry(name: str, a: Any, where: str) -> Tuple[tuple, Any]:
    """The entry of a numpy array, and the object to keep alive."""
    import numpy as np

    sd = NUMPY_TO_STRATA.get((a.dtype.kind, a.dtype.itemsize))
    if sd is None or a.dtype.byteorder == ">" or (a.dtype.byteorder == "=" and not _little()):
        raise InvalidError(f"{where}: numpy dtype {a.dtype} is not supported")
    shape = [int(d) for d in a.shape]
    if not a.flags["C_CONTIGUOUS"]:
        # ascontiguousarray makes a 0-d array 1-d: keep the shape.
        a = np.ascontiguousarray(a).reshape(shape)
    addr = a.__array_interface__["data"][0]
    return (name, sd, shape, (int(addr), int(a.nbytes), None)), a


def _little() -> bool:
    import sys

    return sys.byteorder == "little"


def alloc_torch(dtype: str, shape: List[int], where: str) -> Any:
    import torch

    tn = STRATA_TO_TORCH.get(dtype)
    td = getattr(torch, tn, None) if tn else None
    if td is None:
        raise InvalidError(f"{where}: stored dtype {dtype} has no torch dtype in this torch")
    return torch.empty(shape, dtype=td)


def alloc_numpy(dtype: str, shape: List[int], where: str) -> Any:
    import numpy as np

    nd = STRATA_TO_NUMPY.get(dtype)
    if nd is None:
        raise InvalidError(f"{where}: stored dtype {dtype} has no numpy dtype")
    return np.empty(shape, dtype=nd)


def address(obj: Any) -> Tuple[int, int]:
    """(address, length) of a host tensor, numpy array or bytearray the
    caller allocated (contiguous, writable)."""
    if isinstance(obj, bytearray):
        if not obj:
            return 0, 0
        buf = (ctypes.c_char * len(obj)).from_buffer(obj)
        return ctypes.addressof(buf), len(obj)
    if hasattr(obj, "data_ptr"):
        return int(obj.data_ptr()), obj.numel() * obj.element_size()
    return int(obj.__array_interface__["data"][0]), int(obj.nbytes)


def fillable(t: Any, dtype: str, shape: List[int]) -> Optional[str]:
    """Why tensor ``t`` cannot receive a stored entry in place (None if it
    can): dtype, shape, contiguity, device."""
    got = [int(d) for d in t.shape]
    if hasattr(t, "data_ptr"):
        if TORCH_TO_STRATA.get(torch_dtype_name(t.dtype)) != dtype:
            return f"dtype {t.dtype} where {dtype} is stored"
    elif NUMPY_TO_STRATA.get((t.dtype.kind, t.dtype.itemsize)) != dtype:
        return f"dtype {t.dtype} where {dtype} is stored"
    elif t.dtype.byteorder == ">" or (t.dtype.byteorder == "=" and not _little()):
        return f"byte order of {t.dtype} (stored little-endian)"
    if got != list(shape):
        return f"shape {got} where {list(shape)} is stored"
    return None


def writable_host(buffer: Any) -> Tuple[int, int, Any]:
    """(address, length, an object to keep until the write is done) of a
    writable, C-contiguous host buffer whose memory is all its own; an
    ``InvalidError`` for anything else (a GPU tensor, a broadcast or
    expanded view, a read-only array)."""
    if isinstance(buffer, bytearray):
        # The exported view keeps the bytearray from being resized.
        view = memoryview(buffer)
        if not buffer:
            return 0, 0, view
        import ctypes

        c = (ctypes.c_char * len(buffer)).from_buffer(buffer)
        return ctypes.addressof(c), len(buffer), (view, c)
    if hasattr(buffer, "data_ptr"):
        if buffer.device.type != "cpu":
            raise InvalidError(f"read_into a {buffer.device} tensor: host memory only")
        if not buffer.is_contiguous() or any(s == 0 for s, n in zip(buffer.stride(), buffer.shape) if n > 1):
            raise InvalidError("read_into a non-contiguous (or expanded) tensor")
        n = buffer.numel() * buffer.element_size()
        end = buffer.storage_offset() * buffer.element_size() + n
        if end > buffer.untyped_storage().nbytes():
            raise InvalidError("read_into a tensor larger than its storage")
        return int(buffer.data_ptr()), n, buffer
    flags = getattr(buffer, "flags", None)
    if flags is not None:
        # (A broadcast view is read-only: refused here too.)
        if not (flags["C_CONTIGUOUS"] and flags["WRITEABLE"]):
            raise InvalidError("read_into a read-only or non-contiguous array")
        return int(buffer.__array_interface__["data"][0]), int(buffer.nbytes), buffer
    raise InvalidError(f"read_into a {type(buffer).__name__}: a CPU tensor, numpy array or bytearray")
