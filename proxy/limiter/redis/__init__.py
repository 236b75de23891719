"""The Redis backend and its storage bridge.

``backend`` (``RedisLimiter``: one Lua script per operation, ``lua/*.lua``), ``leases``
(admitting from a lease, of budget or of turns, without a round trip); the bridge:
``runner`` (scripts on a single Redis, a cluster or a Sentinel's primary), ``batch`` (one
round trip per loop turn), ``resp`` (the pipelined connection), ``scripts`` (the Lua
text); the server's set-up: ``sentinel``, ``acl`` (what an ACL user needs), ``eviction``
(what a ``maxmemory-policy`` means).
"""
