"""The sans-IO cores: pure state machines, one per role.

- :mod:`dcp._core.broker`: the broker's routing of every dialect on one socket.
- :mod:`dcp._core.worker`: a worker's registration, credit, heartbeats and liveness.
- :mod:`dcp._core.client`: a client's request tracker (ids, resends, timeouts).

The contract, the same for the three:

- **Input** is method calls with whole multipart messages (``list[bytes]``, as the socket
  gives them) and ``now``: seconds on any monotonic clock the driver chooses. A core never
  reads a clock, never sleeps, never touches a socket, a thread or an event loop, and never
  logs; nothing raises out of it for bad input from the network (it is counted).
- **Output** leaves through two lists, taken together with ``drain()`` after each call or
  batch of calls: ``outbox``, the messages to send, in order, each a ``list[bytes]`` ready
  for the socket (the core writes each peer's dialect and type width itself); and
  ``events``, in order, what else the driver must do (start a handler, write a log line,
  ask the approver, deliver a request's outcome...), each a small frozen value of the
  core's own event classes. A method's own answer (an id, an outcome it returns at once) is
  its return value, never in the lists.
- **Time** is one pair: ``expire(now)`` does whatever is due at ``now`` (resends,
  heartbeats, timeouts, expiries), its results in the lists; ``next_deadline()`` is when it
  next has something to do (``None``: nothing until more input). A driver calls ``expire``
  at that time or later, never needs to poll a flag.
- **Rules** are stated at the top of the module that keeps them, each with an id unique
  across the package (checked by ``tests/test_rule_ids.py``).

What the cores do NOT do: I/O of any kind, logging, clocks, threads, persistence.
"""
