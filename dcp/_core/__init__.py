"""The sans-IO cores: the broker's routing state machine, the worker's, and the client's
request tracker (see ``docs/internals/layers.md``)."""
