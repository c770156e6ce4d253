"""The I/O layer: sockets, their context and handshakes, endpoints, security, the beacon."""
