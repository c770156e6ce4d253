"""Which wire dialect a message speaks, from its first header frames. Pure.

A broker port serves every dialect: each message is sniffed on its own (cheaply: DCP is
tested first), and the broker core remembers per peer what it last spoke, to answer in kind.
"""

from __future__ import annotations

import enum
import typing

from dcp.wire.dbp import COMMANDS as _DBP_COMMANDS
from dcp.wire.mc0 import VERBS as _MC0_VERBS
from dcp.wire.mdp import HEADERS as _MDP_HEADERS

if typing.TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = ["Family", "sniff"]

_DCP_MAGIC = b"DGBX"


class Family(enum.Enum):
    """A family of wire dialects, each parsed by one codec."""

    #: DCP v1 (:mod:`dcp.wire.dcp1`): empty frame, then ``DGBX`` and a version byte.
    DCP = "dcp"
    #: Majordomo (:mod:`dcp.wire.mdp`): ``MDPC0x``/``MDPW0x``, after an optional empty frame.
    MDP = "mdp"
    #: mc0 (:mod:`dcp.wire.mc0`): a verb such as ``SUB`` or ``PUT`` first, no empty frame.
    MC0 = "mc0"
    #: DBP (:mod:`dcp.wire.dbp`): empty frame, then a DBP command (``u_U``, ``UwU``, ...).
    DBP = "dbp"


def sniff(frames: Sequence[bytes]) -> Family | None:
    """The dialect family of a message (DEALER-side frames), or ``None`` if unrecognised.

    A ``DGBX`` protocol frame of any version counts as DCP (its codec then says what is
    wrong with it), as does a message that is only an empty frame and a protocol frame.
    """
    n = len(frames)
    if n >= 2 and not frames[0]:
        head = frames[1]
        if head.__class__ is not bytes:
            head = bytes(memoryview(head)[:8])
        if head[:4] == _DCP_MAGIC:
            return Family.DCP
        if head in _MDP_HEADERS:
            return Family.MDP
        if head in _DBP_COMMANDS:
            return Family.DBP
        return None
    if n >= 1:
        head = frames[0]
        if head.__class__ is bytes and head in _MDP_HEADERS:
            return Family.MDP
        if head.__class__ is bytes and head in _MC0_VERBS:
            return Family.MC0
    return None
