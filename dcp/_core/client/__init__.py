"""The client's sans-IO core: the request tracker (:mod:`~dcp._core.client.tracker`) and its
events (:mod:`~dcp._core.client.events`), the window of the maps
(:mod:`~dcp._core.client.window`), and what building a request takes
(:mod:`~dcp._core.client.calls`), and the brokers of a client given several
(:mod:`~dcp._core.client.brokers`)."""
