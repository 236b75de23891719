"""Rate limiting: the budget every request is checked against (see docs/limiter.md).

By role: ``base`` (the contract: windows, asks, settlements, verdicts); ``core/`` (the
pure cores both backends share: buckets, leases' math, selection, health, fairness,
budgets); the backends: ``memory`` and ``redis/`` (the Redis backend and its storage
bridge, with the Lua scripts); ``policy`` (fail open or closed, over both), ``ledger``
(the spend report's totals) and ``factory.create_limiter``, which builds what a process
needs.
"""
