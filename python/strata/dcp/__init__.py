"""Strata as the storage of ``torch.distributed.checkpoint`` (DCP).

``StorageWriter`` saves a DCP checkpoint as an ordinary Strata step (the
``checkpoint_id`` is the step): each rank's write items become the entries
of its shard, written through Strata's pipeline (chunked,
content-addressed, deduplicated against earlier steps, durable on L1, then
on the peers and L3), and ``finish`` is Strata's commit. It is also DCP's
stager for ``dcp.async_save``: training waits only for a copy into staging
memory reused from the previous save. ``StorageReader`` loads any step at
any world size (resharding), reading only the byte ranges each rank needs,
from whichever rank wrote them, from the fastest tier with a verified
copy::

    import torch.distributed.checkpoint as dcp
    from strata.dcp import StorageReader, StorageWriter

    dcp.save(state, checkpoint_id=100, storage_writer=StorageWriter(job="run", l1_dir="/nvme/strata"))
    dcp.load(state, storage_reader=StorageReader(job="run", l1_dir="/nvme/strata"))  # newest step

See ``docs/python.md`` ("PyTorch DCP") for the layout and the guarantees.
"""

from ._reader import StorageReader
from ._writer import StorageWriter

__all__ = ["StorageReader", "StorageWriter"]
