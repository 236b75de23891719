"""The limiter's pure cores: the math and the decisions both backends share, no I/O.

``bucket`` (GCRA with reservations), ``allowance`` (the lease math), ``turns`` (leases of
a paced deployment's turns), ``selection``
(choosing a deployment), ``health`` (cooldowns, probes, learned rates), ``fairness``
(fair share between keys), ``periods`` and ``quota`` (budgets per calendar period),
``verdicts`` (the glue from the contract's limits to the buckets). The Redis backend's
Lua scripts (``redis/lua/``) mirror them line by line.
"""
