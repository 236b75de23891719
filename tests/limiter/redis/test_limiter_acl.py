"""The ACL user docs/production.md prints may run everything the proxy sends: Redis
checks the commands inside Lua scripts against the user too, so a command added to a
script must be added to ``acl.SCRIPT_COMMANDS`` (the TLS Redis of the suite runs with
exactly this user: ``tests/limiter/test_limiter_contract.py``'s ``redis-tls-acl``)."""

from __future__ import annotations

import re
from fnmatch import fnmatchcase
from importlib import resources

from proxy.limiter.base import KeyLimits
from proxy.limiter.redis import acl
from proxy.limiter.redis.backend import KEY_PREFIX, RedisLimiter


def _script_commands() -> set[str]:
    found: set[str] = set()
    for script in resources.files("proxy.limiter.redis").joinpath("lua").iterdir():
        text = script.read_text("utf-8")
        found |= {c.lower() for c in re.findall(r"redis\.p?call\(\s*'(\w+)'", text)}
        assert not re.search(r"redis\.p?call\(\s*[^'\s]", text), f"{script.name}: a computed name"
    return found


def test_every_command_a_script_calls_is_granted() -> None:
    called = _script_commands()
    assert called and called <= set(acl.COMMANDS), sorted(called - set(acl.COMMANDS))


def test_every_key_the_limiter_names_matches_a_granted_pattern() -> None:
    limiter = RedisLimiter("redis://127.0.0.1:1")
    names = [
        limiter._owner_prefix(KeyLimits("key-a")) + "rpm",
        limiter._owner_prefix(KeyLimits("key-a", team=KeyLimits("t", scope="team"))) + "rpm",
        limiter._owner_prefix(KeyLimits("t", scope="team")) + "rpm",
        limiter._deployment("gpt-4o", "azure-east", "health"),
        limiter._fairness("gpt-4o", "waiting"),
        limiter._replicas(),
        limiter._activity(),
    ]
    assert all(n.startswith((KEY_PREFIX, "{" + KEY_PREFIX)) for n in names)
    for name in names:
        assert any(fnmatchcase(name, pattern) for pattern in acl.KEY_PATTERNS), name


def test_the_setuser_line_grants_nothing_else() -> None:
    line = acl.setuser_line("llmproxy", "pw")
    assert line.startswith("ACL SETUSER llmproxy reset on >pw ")
    assert "-@all" in line and "resetchannels" in line
    assert "+config|get" not in line and "+config|get" in acl.setuser_line(
        "u", "p", config_get=True
    )


def test_the_admin_api_key_store_is_granted_its_commands_and_keys() -> None:
    """The run-time client keys (keys/redis_backend.py) share the Redis and its ACL user:
    the commands of their write scripts and of their reads, and their key names."""
    from proxy.keys import redis_backend

    source = resources.files("proxy.keys").joinpath("redis_backend.py").read_text("utf-8")
    in_scripts = {c.lower() for c in re.findall(r"redis\.p?call\(\s*'(\w+)'", source)}
    read = {"get", "hscan", "hmget", "hget"}  # the client's own calls (redis_backend._load...)
    assert in_scripts and (in_scripts | read) <= set(acl.COMMANDS), sorted(
        (in_scripts | read) - set(acl.COMMANDS)
    )
    names = [
        redis_backend.RECORDS,
        redis_backend.VERSION,
        redis_backend.CHANGES,
        redis_backend.TRIMMED,
    ]
    for name in names:
        assert any(fnmatchcase(name, pattern) for pattern in acl.KEY_PATTERNS), name
