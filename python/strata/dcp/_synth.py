"""DCP metadata for a step the native ``Checkpointer`` saved (it has no
``.metadata``): every rank's tensor entries, placed in their global tensor
by the layout recorded with the shard (DTensor shards), else as whole
tensors named by their path. A tensor that several ranks saved whole (a
replicated parameter) is read from the lowest rank."""

from __future__ import annotations

from typing import Any, Dict, List, Tuple

import torch
from torch.distributed.checkpoint.metadata import (
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    TensorProperties,
    TensorStorageMetadata,
)

from .._arrays import STRATA_TO_TORCH
from .._errors import InvalidError
from ._names import LAYOUT_KEY, parse_layout


def synthesize(cat: Any, step: int, world: int) -> Metadata:
    tensors: Dict[str, Tuple[str, List[int], List[Any]]] = {}
    storage: Dict[MetadataIndex, Tuple[int, str]] = {}
    seen = set()
    for rank in range(world):
        layout = parse_layout(cat.metadata(step, rank).get(LAYOUT_KEY))
        for name, dtype, shape, _ in cat.entries(step, rank):
            if dtype is None or shape is None:
                continue  # blobs: the state tree, bytes
            fqn, gshape, offsets = layout.get(name, (name, list(shape), [0] * len(shape)))
            if any(int(d) == 0 for d in shape) and name in layout:
                continue  # an empty local shard holds nothing
            if (fqn, tuple(offsets)) in seen:
                continue
            seen.add((fqn, tuple(offsets)))
            known = tensors.get(fqn)
            if known is None:
                known = (dtype, list(gshape), [])
                tensors[fqn] = known
            elif known[0] != dtype or known[1] != list(gshape):
                raise InvalidError(
                    f"step {step}: {fqn} is {known[0]}{known[1]} on one rank and {dtype}{list(gshape)} on rank {rank}"
                )
            known[2].append(ChunkStorageMetadata(offsets=torch.Size(offsets), sizes=torch.Size(shape)))
            storage[MetadataIndex(fqn, torch.Size(offsets))] = (rank, name)
    md: Dict[str, Any] = {}
    for fqn, (dtype, gshape, chunks) in tensors.items():
        tn = STRATA_TO_TORCH.get(dtype)
        td = getattr(torch, tn, None) if tn else None
        if td is None:
            raise InvalidError(f"step {step}: {fqn} has dtype {dtype}, which this torch lacks")
        md[fqn] = TensorStorageMetadata(
            properties=TensorProperties(dtype=td), size=torch.Size(gshape), chunks=chunks
        )
    return Metadata(state_dict_metadata=md, storage_data=storage)
