"""The I/O layer: sockets, their context and handshakes, endpoints, security, the beacon, a
socket served by a thread of its own (:mod:`.blocking`), what dcp does with zmq's errors
(:mod:`.errors`, the one place that catches them) and the lifecycle of the public context
managers (:mod:`.lifecycle`)."""
