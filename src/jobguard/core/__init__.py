"""Pure decisions with no I/O: state transitions, retry and backoff, poison, keys, fencing."""
