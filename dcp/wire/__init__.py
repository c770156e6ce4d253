"""The wire: pure codecs that turn frames into messages and back, for every dialect the
broker speaks. They hold no state and do no I/O; the broker core remembers per peer which
dialect it speaks.

- :mod:`dcp.wire.dcp1`: DCP v1 frames, both type-frame widths (the spec's 1 byte, DagBox
  C++'s 4); :mod:`dcp.wire.messages`: its six messages as frozen value classes;
  :mod:`dcp.wire.options`: dcp's request options (``\\xffDCP:`` metadata parts).
- :mod:`dcp.wire.streams`: dcp streams (partial replies with credit).
- :mod:`dcp.wire.mdp`: Majordomo: MDP/0.1 (ZeroMQ RFC 7), MDP/0.2 (RFC 18), majortomo's
  variant. :mod:`dcp.wire.dbp`: DBP (seed 003). :mod:`dcp.wire.mc0`: mc0 pub/sub.
- :mod:`dcp.wire.sniff`: which dialect a message speaks, from its header frames.

The DCP v1 names are here too (``dcp.wire.Request``, ``dcp.wire.parse``, ...), and the
errors :func:`parse` raises: each a :exc:`dcp.RemoteProtocolError` naming what is wrong.
"""

from __future__ import annotations

from dcp._errors import BadProtocolFrame as BadProtocolFrame
from dcp._errors import BadTypeFrame as BadTypeFrame
from dcp._errors import MessageTooLarge as MessageTooLarge
from dcp._errors import MissingClientDelimiter as MissingClientDelimiter
from dcp._errors import MissingEnvelopeDelimiter as MissingEnvelopeDelimiter
from dcp._errors import MissingMetadataDelimiter as MissingMetadataDelimiter
from dcp._errors import MissingServiceName as MissingServiceName
from dcp._errors import TooFewFrames as TooFewFrames
from dcp._errors import TooManyFrames as TooManyFrames
from dcp._errors import UnexpectedFrames as UnexpectedFrames
from dcp._errors import UnknownMessageType as UnknownMessageType
from dcp._errors import UnsupportedVersion as UnsupportedVersion
from dcp._util import fixup_module_metadata
from dcp.wire.dcp1 import PROTOCOL as PROTOCOL
from dcp.wire.dcp1 import parse as parse
from dcp.wire.dcp1 import serialize as serialize
from dcp.wire.messages import ERROR_MARKER as ERROR_MARKER
from dcp.wire.messages import Message as Message
from dcp.wire.messages import MessageType as MessageType
from dcp.wire.messages import Ping as Ping
from dcp.wire.messages import Pong as Pong
from dcp.wire.messages import Reconnect as Reconnect
from dcp.wire.messages import Register as Register
from dcp.wire.messages import Reply as Reply
from dcp.wire.messages import Request as Request

__all__ = [
    "ERROR_MARKER",
    "PROTOCOL",
    "BadProtocolFrame",
    "BadTypeFrame",
    "Message",
    "MessageTooLarge",
    "MessageType",
    "MissingClientDelimiter",
    "MissingEnvelopeDelimiter",
    "MissingMetadataDelimiter",
    "MissingServiceName",
    "Ping",
    "Pong",
    "Reconnect",
    "Register",
    "Reply",
    "Request",
    "TooFewFrames",
    "TooManyFrames",
    "UnexpectedFrames",
    "UnknownMessageType",
    "UnsupportedVersion",
    "parse",
    "serialize",
]

fixup_module_metadata(__name__, globals())
del fixup_module_metadata
