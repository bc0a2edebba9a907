"""Where a tensor entry lies in its global tensor (DTensor shards, DCP
write items): the manifest metadata key :data:`LAYOUT_KEY` holds a JSON
object ``{entry name: [fqn, global shape, offsets]}``."""

from __future__ import annotations

import json
from typing import Dict, List, Optional, Tuple

from ._errors import InvalidError

LAYOUT_KEY = "strata.layout"

# One tensor entry's place: (fqn, global shape, offsets of its chunk).
Place = Tuple[str, List[int], List[int]]


def layout_json(places: Dict[str, Place]) -> str:
    return json.dumps({k: [f, list(s), list(o)] for k, (f, s, o) in places.items()}, separators=(",", ":"))


def parse_layout(text: Optional[str]) -> Dict[str, Place]:
    """The layout of a shard's metadata; an ``InvalidError`` if malformed."""
    if not text:
        return {}
    try:
        raw = json.loads(text)
        out: Dict[str, Place] = {}
        for k, v in raw.items():
            fqn, shape, offsets = v
            shape = [int(x) for x in shape]
            offsets = [int(x) for x in offsets]
            if not isinstance(fqn, str) or len(shape) != len(offsets):
                raise ValueError(k)
            out[str(k)] = (fqn, shape, offsets)
        return out
    except (ValueError, TypeError, AttributeError) as e:
        raise InvalidError(f"the shard's {LAYOUT_KEY} is malformed: {e}") from None
