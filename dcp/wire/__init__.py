"""Wire dialects: pure codecs that turn frames into protocol-neutral events and back.

- :mod:`dcp.wire.dcp1`: DCP v1, both type-frame widths (the spec's 1 byte, DagBox C++'s 4).
- :mod:`dcp.wire.mdp`: Majordomo: MDP/0.1 (ZeroMQ RFC 7), MDP/0.2 (RFC 18), majortomo's
  variant.
- :mod:`dcp.wire.sniff`: which dialect a message speaks, from its header frames.

They hold no state; the broker core remembers per peer which dialect it speaks.
"""

__all__: list[str] = []
