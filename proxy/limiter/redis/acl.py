"""What the proxy needs of a Redis ACL user: the commands it sends and those its Lua
scripts call (Redis checks both against the user), and the key patterns it writes.
docs/production.md prints ``setuser_line`` as the ready ``ACL SETUSER`` line. *pure*"""

from __future__ import annotations

__all__ = ["COMMANDS", "KEY_PATTERNS", "OPTIONAL_COMMANDS", "setuser_line"]

# Sent by the proxy itself (runner.py, resp.py, backend.py; redis-py's connection set-up).
CLIENT_COMMANDS = (
    "fcall",  # the bucket scripts as Redis 7 functions
    "function|load",  # loading them (refused: scripts with EVALSHA instead)
    "evalsha",
    "script|load",  # after NOSCRIPT (a restarted or flushed Redis)
    "info",  # INFO cluster: a single Redis or a cluster?
    "ping",
    "select",
    "zrem",  # a replica leaving the heartbeat set
)  # (redis-py's CLIENT SETINFO on connect may be refused: it carries on)
# Called from the Lua scripts (lua/*.lua).
SCRIPT_COMMANDS = (
    "time",
    "del",
    "hdel",
    "hget",
    "hgetall",
    "hincrbyfloat",  # the spend report's totals (record_spend.lua)
    "get",  # its writers' marks, held estimates (record_spend.lua, claim_spend.lua)
    "set",
    "hmget",
    "hset",
    "pexpire",
    "pttl",
    "zadd",
    "zcard",
    "zcount",
    "zrange",
    "zrangebyscore",
    "zrem",
    "zremrangebyscore",
    "zscore",
)
# The admin API's client keys (keys/redis_backend.py): its reads, and its write scripts.
KEY_STORE_COMMANDS = (
    "get",
    "hget",
    "hmget",
    "hscan",
    "hset",
    "hdel",
    "incr",
    "set",
    "zadd",
    "zcard",
    "zrange",
    "zrangebyscore",
    "zrem",
    "zremrangebyrank",
    "zscore",
)
# Where each stored response lives (affinity.py): one key per response id.
AFFINITY_COMMANDS = ("get", "set", "del")
COMMANDS = tuple(
    dict.fromkeys(CLIENT_COMMANDS + SCRIPT_COMMANDS + KEY_STORE_COMMANDS + AFFINITY_COMMANDS)
)
# Reading maxmemory-policy (eviction.py). Optional: CONFIG GET also reads every other
# setting; without it the proxy says once that it cannot check the policy.
OPTIONAL_COMMANDS = ("config|get",)
# Every key is under the schema's prefix (backend.KEY_PREFIX), hash-tagged or not.
KEY_PATTERNS = ("{llmproxy:*", "llmproxy:*")


def setuser_line(user: str, password: str, *, config_get: bool = False) -> str:
    """``ACL SETUSER`` for a user with only what the proxy needs."""
    commands = COMMANDS + (OPTIONAL_COMMANDS if config_get else ())
    return " ".join(
        [
            "ACL SETUSER",
            user,
            "reset on",
            f">{password}",
            *(f"~{pattern}" for pattern in KEY_PATTERNS),
            "resetchannels -@all",
            *(f"+{command}" for command in commands),
        ]
    )
