"""``llm-proxy showcase`` (``make showcase``): the problem the proxy solves, measured.

The same concurrent calls, by the same naive client (the OpenAI SDK with its default
retries), once straight at a strict upstream and once through the proxy, at the same
time, each side against its own fake upstream: how long they took, how many 429s the
upstream answered, how many calls failed. ``scenario`` runs it, ``report`` tabulates it
*pure*, ``chart`` draws the timeline (matplotlib, only there).
"""
