"""Talking to upstreams: the pooled client, forwarding, error mapping, stream taps."""
