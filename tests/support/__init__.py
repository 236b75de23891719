"""Helpers shared by the test suites: real servers and processes, no mocks.

``support.redis_server`` starts throwaway ``redis-server`` processes and Redis Clusters
on free 127.0.0.1 ports; the pytest fixtures wrapping it (``redis_url``,
``redis_cluster_url``, ``disposable_redis``) live in ``tests/conftest.py``.
"""
