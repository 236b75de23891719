"""Rate limiting: the budget every request is checked against (see docs/limiter.md).

Pure modules: ``base`` (the contract: windows, asks, settlements, verdicts), ``bucket``
(GCRA with reservations), ``selection`` (choosing a deployment), ``health`` (cooldowns,
probes, learned rates), ``verdicts`` (glue). Backends: ``memory``, ``redis`` over
``runner`` (the storage bridge, with ``batch``, ``resp`` and ``scripts``), and ``policy``
(fail open or closed). ``factory.create_limiter`` builds what a process needs.
"""
