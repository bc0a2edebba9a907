"""A nested state as flat entries plus a safe description of its shape.

``flatten`` walks a state (dicts, lists, tuples, sets, tensors, numpy arrays,
plain Python values) and returns the arrays to store as tensor entries and a
JSON *tree* describing everything else. ``unflatten`` rebuilds the state from
the tree and the restored arrays. The tree is JSON with tagged nodes; no
pickle is ever involved, so loading a checkpoint never runs code from a
tier (and the tree's bytes are verified against the commit record before
they are parsed, like every other byte).

Tree nodes:

* ``str``, ``int``, ``float`` (including nan and inf), ``bool``, ``None``:
  themselves;
* ``{"d": [[key, node], ...]}`` a dict (``"od"``: an OrderedDict), keys are
  nodes too (ints stay ints);
* ``{"l": [...]}`` a list, ``{"t": [...]}`` a tuple, ``{"set": [...]}``,
  ``{"fset": [...]}``;
* ``{"T": name}`` a torch tensor entry, ``{"N": name}`` a numpy array entry
  (a tensor referenced twice, such as tied weights, names one entry);
* ``{"b": base64}`` small bytes, ``{"B": name}`` bytes stored as a blob
  entry;
* ``{"c": [re, im]}`` complex, ``{"np": [dtype, value]}`` a numpy scalar,
  ``{"dt": "float32"}`` a torch dtype, ``{"sz": [...]}`` a torch.Size,
  ``{"dev": "cuda:0"}`` a torch device.
"""

from __future__ import annotations

import base64
import json
from collections import OrderedDict
from typing import Any, Callable, Dict, List, Optional, Tuple

from ._errors import InvalidError
from ._layout import Place

TREE_ENTRY = "__strata_tree__"
TREE_VERSION = 1
# Bytes leaves at least this long are stored as entries of their own instead
# of base64 inside the tree.
BLOB_INLINE_MAX = 4096


def _torch():
    import sys

    return sys.modules.get("torch")


def _numpy():
    import sys

    return sys.modules.get("numpy")


def path_text(path: Tuple[Any, ...]) -> str:
    return ".".join(str(p) for p in path) if path else "<root>"


class Leaf:
    """An array to store as an entry: ``kind`` is ``"torch"``, ``"numpy"``
    or ``"bytes"``."""

    __slots__ = ("name", "kind", "value", "path")

    def __init__(self, name: str, kind: str, value: Any, path: Tuple[Any, ...]):
        self.name = name
        self.kind = kind
        self.value = value
        self.path = path


class EntryNames:
    """Entry names of one shard: valid Strata names (1-4096 bytes, no
    control characters; anything else gets ``fallback``), unique (a name
    taken already gets ``#1``, ``#2``, ...)."""

    def __init__(self, reserved: Any = ()) -> None:
        self.names: Dict[str, int] = {n: 1 for n in reserved}

    def name(self, base: str, fallback: str) -> str:
        # A key that makes another name gets a generated one (the caller
        # keeps the real path or FQN either way).
        if not base or len(base.encode("utf-8", "surrogatepass")) > 4000 or any(
            ord(ch) < 32 or 127 <= ord(ch) < 160 for ch in base
        ):
            base = fallback
        n = self.names.get(base, 0)
        self.names[base] = n + 1
        if n == 0:
            return base
        name = f"{base}#{n}"
        while name in self.names:
            n += 1
            name = f"{base}#{n}"
        self.names[name] = 1
        return name


class _Flattener:
    def __init__(self) -> None:
        self.leaves: List[Leaf] = []
        self.entry_names = EntryNames({TREE_ENTRY})
        # One entry per distinct view: the same tensor object, or another
        # object over the same memory with the same dtype, shape and strides
        # (tied weights in a state_dict()).
        self.seen: Dict[Any, str] = {}
        # Keeps every object whose id() is in `seen` alive, so ids stay unique.
        self.keep: List[Any] = []
        # DTensor entries: their place in the global tensor.
        self.layouts: Dict[str, Place] = {}

    def name_for(self, path: Tuple[Any, ...]) -> str:
        return self.entry_names.name(path_text(path), f"entry.{len(self.leaves)}")

    def leaf(self, kind: str, value: Any, path: Tuple[Any, ...]) -> str:
        key = _view_key(kind, value)
        if key in self.seen:
            return self.seen[key]
        name = self.name_for(path)
        self.seen[key] = name
        self.keep.append(value)
        self.leaves.append(Leaf(name, kind, value, path))
        return name

    def node(self, v: Any, path: Tuple[Any, ...]) -> Any:
        if v is None or isinstance(v, (bool, str)):
            return v
        torch = _torch()
        np = _numpy()
        dtensor = dtensor_type()
        if dtensor is not None and isinstance(v, dtensor):
            # The local shard, with its place in the global tensor (so a
            # DCP reader of another world size can reshard it).
            name = self.leaf("torch", v.to_local(), path)
            chunks = v.__create_chunk_list__()
            offsets = [int(x) for x in chunks[0].offsets] if chunks else [0] * v.dim()
            self.layouts[name] = (path_text(path), [int(x) for x in v.shape], offsets)
            return {"T": name}
        if torch is not None and isinstance(v, torch.Tensor):
            return {"T": self.leaf("torch", v, path)}
        if np is not None and isinstance(v, np.ndarray):
            return {"N": self.leaf("numpy", v, path)}
        if np is not None and isinstance(v, np.generic):
            if v.dtype.kind in "biuf":
                return {"np": [v.dtype.str, v.item()]}
            raise InvalidError(f"{path_text(path)}: numpy scalar of dtype {v.dtype} is not supported")
        if isinstance(v, int):
            return int(v)
        if isinstance(v, float):
            return float(v)
        if isinstance(v, complex):
            return {"c": [v.real, v.imag]}
        if isinstance(v, (bytes, bytearray, memoryview)):
            b = bytes(v)
            if len(b) >= BLOB_INLINE_MAX:
                return {"B": self.leaf("bytes", b, path)}
            return {"b": base64.b64encode(b).decode("ascii")}
        if isinstance(v, dict):
            tag = "od" if isinstance(v, OrderedDict) else "d"
            return {tag: [[self.key(k, path), self.node(x, path + (k,))] for k, x in v.items()]}
        if isinstance(v, list):
            return {"l": [self.node(x, path + (i,)) for i, x in enumerate(v)]}
        if isinstance(v, tuple):
            if torch is not None and isinstance(v, torch.Size):
                return {"sz": [int(x) for x in v]}
            return {"t": [self.node(x, path + (i,)) for i, x in enumerate(v)]}
        if isinstance(v, (set, frozenset)):
            tag = "fset" if isinstance(v, frozenset) else "set"
            return {tag: [self.key(x, path) for x in v]}
        if torch is not None and isinstance(v, torch.dtype):
            return {"dt": str(v).replace("torch.", "")}
        if torch is not None and isinstance(v, torch.device):
            return {"dev": str(v)}
        if is_stateful(v):
            # A model, an optimizer, a dataloader: their state_dict().
            return self.node(v.state_dict(), path)
        raise InvalidError(
            f"{path_text(path)}: cannot store a {type(v).__module__}.{type(v).__qualname__} "
            "(state holds tensors, numpy arrays, dicts, lists, tuples, sets, numbers, "
            "strings, bytes and None; convert other objects, e.g. with their state_dict())"
        )

    def key(self, k: Any, path: Tuple[Any, ...]) -> Any:
        """A dict key or set member: always inline (never an entry)."""
        if k is None or isinstance(k, (bool, str, int, float, complex)):
            return self.node(k, path)
        if isinstance(k, bytes):
            return {"b": base64.b64encode(k).decode("ascii")}
        if isinstance(k, tuple):
            return {"t": [self.key(x, path) for x in k]}
        if isinstance(k, frozenset):
            return {"fset": [self.key(x, path) for x in k]}
        raise InvalidError(f"{path_text(path)}: a dict key or set member of type {type(k).__name__} is not supported")


def _view_key(kind: str, v: Any) -> Any:
    if kind == "torch" and v.numel() > 0:
        return ("torch", v.data_ptr(), str(v.device), str(v.dtype), tuple(v.shape), tuple(v.stride()))
    if kind == "numpy" and v.size > 0:
        return ("numpy", v.__array_interface__["data"][0], v.dtype.str, v.shape, v.strides)
    return id(v)


def dtensor_type() -> Any:
    """torch's DTensor class, if torch is loaded and has one."""
    import sys

    mod = sys.modules.get("torch.distributed.tensor")
    if mod is None and _torch() is not None:
        try:
            import torch.distributed.tensor as mod  # noqa: F811
        except ImportError:
            return None
    return getattr(mod, "DTensor", None)


def is_stateful(v: Any) -> bool:
    """An object with ``state_dict`` and ``load_state_dict`` (torch's
    ``Stateful``: modules, optimizers, schedulers, stateful dataloaders)
    that is not itself a container or a tensor."""
    torch = _torch()
    if isinstance(v, (dict, list, tuple, str, bytes)) or (torch is not None and isinstance(v, torch.Tensor)):
        return False
    return callable(getattr(v, "state_dict", None)) and callable(getattr(v, "load_state_dict", None))


def flatten(state: Any, layouts: Optional[Dict[str, Place]] = None) -> Tuple[bytes, List[Leaf]]:
    """The tree (JSON bytes) and the leaves to store as entries, in order;
    the places of DTensor shards go to ``layouts``."""
    f = _Flattener()
    root = f.node(state, ())
    if layouts is not None:
        layouts.update(f.layouts)
    doc = {"strata_tree": TREE_VERSION, "root": root}
    return json.dumps(doc, separators=(",", ":"), allow_nan=True).encode(), f.leaves


def parse(tree: bytes) -> Any:
    """The root node of a stored tree."""
    try:
        doc = json.loads(tree.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise InvalidError(f"the stored state tree is not valid JSON: {e}") from None
    if not isinstance(doc, dict) or doc.get("strata_tree") != TREE_VERSION or "root" not in doc:
        raise InvalidError("the stored state tree has an unknown version")
    return doc["root"]


def entry_refs(node: Any, out: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    """Entry name -> kind ("T", "N", "B") of every entry a tree refers to."""
    if out is None:
        out = {}
    stack = [node]
    while stack:
        n = stack.pop()
        if isinstance(n, dict) and len(n) == 1:
            (tag, body), = n.items()
            if tag in ("T", "N", "B") and isinstance(body, str):
                out[body] = tag
            elif tag in ("d", "od") and isinstance(body, list):
                for kv in body:
                    if isinstance(kv, list) and len(kv) == 2:
                        stack.append(kv[0])
                        stack.append(kv[1])
            elif tag in ("l", "t", "set", "fset") and isinstance(body, list):
                stack.extend(body)
    return out


def unflatten(node: Any, entry: Callable[[str, str, Tuple[Any, ...]], Any]) -> Any:
    """Rebuilds the state; ``entry(tag, name, path)`` returns the value of an
    entry reference. A tree Strata did not write (damaged, hostile) is an
    ``InvalidError``, whatever is wrong with it."""
    try:
        return _unflatten(node, entry, ())
    except InvalidError:
        raise
    except (TypeError, ValueError, KeyError, AttributeError, RuntimeError, RecursionError, OverflowError) as e:
        raise InvalidError(f"the stored state tree is malformed: {type(e).__name__}: {e}") from None


def _unflatten(node: Any, entry: Callable[[str, str, Tuple[Any, ...]], Any], path: Tuple[Any, ...]) -> Any:
    if node is None or isinstance(node, (bool, str, int, float)):
        return node
    if isinstance(node, dict) and len(node) == 1:
        (tag, body), = node.items()
        if tag in ("T", "N", "B") and isinstance(body, str):
            return entry(tag, body, path)
        if tag in ("d", "od") and isinstance(body, list):
            out = OrderedDict() if tag == "od" else {}
            for kv in body:
                if not (isinstance(kv, list) and len(kv) == 2):
                    break
                k = _unflatten(kv[0], entry, path)
                out[k] = _unflatten(kv[1], entry, path + (k,))
            else:
                return out
        elif tag in ("l", "t") and isinstance(body, list):
            items = [_unflatten(x, entry, path + (i,)) for i, x in enumerate(body)]
            return items if tag == "l" else tuple(items)
        elif tag in ("set", "fset") and isinstance(body, list):
            items = [_unflatten(x, entry, path) for x in body]
            return set(items) if tag == "set" else frozenset(items)
        elif tag == "b" and isinstance(body, str):
            try:
                return base64.b64decode(body.encode("ascii"), validate=True)
            except ValueError:
                pass
        elif tag == "c" and isinstance(body, list) and len(body) == 2:
            return complex(body[0], body[1])
        elif tag == "np" and isinstance(body, list) and len(body) == 2:
            np = _numpy()
            if np is None:
                import numpy as np  # noqa: F811 - the state held numpy scalars
            dt = np.dtype(body[0])
            if dt.kind not in "biuf" or dt.itemsize > 16:
                raise InvalidError(f"{path_text(path)}: stored numpy scalar of dtype {dt}")
            return dt.type(body[1])
        elif tag == "sz" and isinstance(body, list):
            import torch

            return torch.Size(body)
        elif tag == "dt" and isinstance(body, str):
            import torch

            dt = getattr(torch, body, None)
            if isinstance(dt, torch.dtype):
                return dt
        elif tag == "dev" and isinstance(body, str):
            import torch

            return torch.device(body)
    raise InvalidError(f"{path_text(path)}: the stored state tree has a node Strata does not know")
