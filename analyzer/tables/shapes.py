"""An op's recorded input shapes (the host-op table's ``input_dims``), read one input at a time.

Contract: ``dims`` holds one list of dimensions per input of the op, in call order; an input that is
no tensor (a scalar, a list, None) is recorded as an empty list or None. The work tables' layouts
(``rules/work_ops.toml``, ``rules/attention_ops.toml``) and the roofline read inputs by index through
:func:`input_shape`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def input_shape(dims: Sequence[Any] | None, i: int | None) -> Any:
    """The recorded shape of input ``i``: None when the op recorded no input ``i`` (or ``i`` is
    None); an input recorded without a shape comes back as recorded (an empty list or None)."""
    if not dims or i is None or i >= len(dims):
        return None
    return dims[i]
