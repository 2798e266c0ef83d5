"""`streamlib chaos`: a built-in fault-injection verifier, in the manner of Jepsen, in
two modes over the same machinery -- direct mode (clients that reach the bookies
themselves) and broker mode (clients of the stream service, `--brokers N`).

    cli.py      the command: flags, the seed, the data directory, exit codes
    plan.py     the faults, planned from the seed alone (pure); --disk-faults adds disk ones
    run.py      the harness both modes share: workers, faults carried out, drain, scan
    direct.py   direct mode's cluster, workers, heal and report
    service.py  broker mode's cluster, workers and report
    workers.py  the worker processes (python -m streamlib.chaos.workers)
    events.py   the workers' event logs: written by them, followed by the harness
    verdict.py  what the logs say: lost, duplicated, reordered, misplaced (pure)
    resources.py  every process's RSS and descriptors, sampled; flat or growing (judge: pure)
    partition_plan.py  --partitions: the network faults, planned from the seed (pure)
    partitions.py      --partitions: either mode on network-namespace hosts, partitions applied
    hosts.py    the hosts themselves (Linux network namespaces on a switch), also the tests'
    zookeeper.py  Debian's ZooKeeper run in a host

A worker is an application of the public API: it reaches a stream only through
streamlib.client.Client (Client.connect("streamlib://...") gives the stream service's
client) and the public types it takes and gives (positions, errors, BookieClientConfig).
This package must never import a server's code (bookie's server and storage,
streamlib.broker but for its launcher) nor the service client's package
(streamlib.service): what it checks is what an application sees. The harness runs the
servers as processes only, through streamlib.sandbox and the launchers. plan.py and
verdict.py (and resources.judge) stay pure: no clock, no processes, no files.
"""
