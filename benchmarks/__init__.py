"""The dcp benchmark suite: dcp's broker side by side with the brokers a user would pick
instead, each run as separate processes over ``tcp://127.0.0.1``.

Run it with ``scripts/bench`` (or ``python -m benchmarks.run``); it writes
``docs/performance.md`` and the plots in ``docs/perf/``. Modules:

- :mod:`benchmarks.run`: the orchestrator (rounds, variants, sweeps, client CPU);
- :mod:`benchmarks.loadgen`: the common load generator (plain synchronous pyzmq; DCP, MDP 0.2
  and raw-proxy modes);
- :mod:`benchmarks.echo_worker`: the common echo workers (many DEALER sockets per process);
- :mod:`benchmarks.minimal_broker`: a minimal synchronous pyzmq DCP broker;
- :mod:`benchmarks.proxy`: ``zmq.proxy`` (ROUTER/DEALER forwarding in C);
- :mod:`benchmarks.dcp_peers`: load from dcp's own clients, and dcp's own workers;
- :mod:`benchmarks.mdp`: the majortomo 0.2.0 broker, its own client and its own workers;
- :mod:`benchmarks.mdp_peers`: MDP peers through the dcp broker against the same peers
  through majortomo's (its own section of the page);
- :mod:`benchmarks.variants`: which broker, workers and load generator make each variant;
- :mod:`benchmarks.sweep`: scaling sweeps of the dcp broker (minimal broker as control);
- :mod:`benchmarks.report`: the tables, targets and plots;
- :mod:`benchmarks.profile_broker`: the dcp broker under cProfile with the common load;
- :mod:`benchmarks.chaos`: the chaos test (faults and deadlines; not a benchmark, its figures
  are in ``docs/reliability.md``), with :mod:`benchmarks.chaos_peers` (its workers and
  clients), :mod:`benchmarks.chaos_deadlines` and :mod:`benchmarks.chaos_figures`;
- :mod:`benchmarks.ab`: the dcp broker from two git revisions side by side (did a change
  cost anything?);
- :mod:`benchmarks.spark`: ``dcp.spark`` rows/s against the plain ``SyncClient`` loop
  outside Spark (``python -m benchmarks.spark``; its own section of the page);
- :mod:`benchmarks.sections`: page sections written by another benchmark, kept when the page
  is regenerated;
- :mod:`benchmarks.attacks`: the adversarial suite (not a benchmark: each attack of issue 26
  against a broker process, its table in ``docs/security.md``).

Every process is started by :mod:`benchmarks.procs` and killed by its PID when the step that
started it ends, whatever happens.
"""
