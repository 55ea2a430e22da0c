"""What every protocol message is: the base class the codec (``sfaas.runtime.wire``) knows.

Each protocol declares its messages, and the rows inside them, in its own module of
``sfaas.runtime.protocols``; the codec imports them all and registers their tags. The
protocol modules import only this one, so the codec can import them without a cycle.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

__all__ = ["Message"]


@dataclass(slots=True)
class Message:
    """Base of all channel messages; subclasses set a unique ``TAG``.

    Fields are encoded in declaration order; a field of rows (``list[Row]``, ``Row`` a
    ``NamedTuple``) is a list of msgpack arrays on the wire and decodes into ``Row``s. A
    sender may still give plain lists or tuples as rows: the bytes are the same. The last
    ``OPTIONAL`` fields may be absent (see it).
    """

    TAG: ClassVar[int] = 0
    #: How many of its last fields are optional on the wire: each defaults to None, and a
    #: sender leaves out the trailing ones that are None (no bytes for them); the decoder
    #: takes from ``len(fields) - OPTIONAL`` fields up, the missing ones None.
    OPTIONAL: ClassVar[int] = 0
