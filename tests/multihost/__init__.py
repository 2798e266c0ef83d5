"""Multi-host tests: hosts made of Linux network namespaces on one machine, so that
network faults (a pulled cable, packets lost between two hosts, one-way loss) can be
made for real. Needs root, `ip netns` and nftables; see hosts.py."""
