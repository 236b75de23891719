"""Which model group serves the name a client sends as ``model``. *pure*

A group is reached by its own name or one of its ``aliases`` (exact names), else by the
longest pattern that matches: a group whose name holds ``*`` (``claude-*``). ``*`` is the
one wildcard: any run of characters, none included. Nothing else is pattern syntax: ``?``,
``[`` and ``]`` stand for themselves, so a name such as ``claude-opus-4-8[1m]`` (one
Claude Code sends) is an exact name, as an alias or a group's name.

    1. a group's name or an alias, exactly       (never two of them the same: checked)
    2. the matching pattern with the most characters besides ``*``
       (never two as long that can match one name: checked, ``overlap``)
    3. none: 404

``ModelNames.resolve`` answers on the request path (one dict lookup, then the patterns,
longest first); ``problems`` checks a config's ``models`` entries for the ambiguities
the rules forbid, each naming its field, as ``check-config`` reports them.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

__all__ = ["WILDCARD", "ModelNames", "Named", "Pattern", "is_pattern", "overlap", "problems"]

WILDCARD = "*"


class Named(Protocol):
    """A configured group as far as names go (``config.ModelGroup``)."""

    @property
    def name(self) -> str: ...

    @property
    def aliases(self) -> Sequence[str]: ...


def is_pattern(name: str) -> bool:
    """Whether a group's name is a pattern (holds ``*``)."""
    return WILDCARD in name


@dataclass(frozen=True, slots=True)
class Pattern:
    """A group's name with ``*`` in it, ready to match: its literal runs, and its length
    (the characters besides ``*``), which ranks it among the patterns that match."""

    group: str
    parts: tuple[str, ...]
    length: int

    @classmethod
    def of(cls, group: str) -> Pattern:
        parts = tuple(group.split(WILDCARD))
        return cls(group, parts, sum(len(p) for p in parts))

    def matches(self, name: str) -> bool:
        """Whether ``name`` is one this pattern stands for: its first run at the start,
        its last at the end, the others in order between (leftmost first: with ``*``
        alone as a wildcard, the earliest place of each run never loses a match)."""
        parts = self.parts
        if len(name) < self.length:
            return False
        head, tail = parts[0], parts[-1]
        if not name.startswith(head) or not name.endswith(tail):
            return False
        at, end = len(head), len(name) - len(tail)
        for part in parts[1:-1]:
            found = name.find(part, at, end)
            if found < 0:
                return False
            at = found + len(part)
        return True


class ModelNames:
    """The names clients may send, each to its group's name: ``resolve``."""

    __slots__ = ("aliases", "exact", "patterns")

    def __init__(self, groups: Iterable[tuple[str, Sequence[str]]]) -> None:
        """``groups``: each group's name and aliases, in the config's order. Should two
        exact names collide (a config ``problems`` reports), the first one wins."""
        self.exact: dict[str, str] = {}
        self.aliases: dict[str, tuple[str, ...]] = {}
        patterns: list[Pattern] = []
        for name, aliases in groups:
            if is_pattern(name):
                patterns.append(Pattern.of(name))
            else:
                self.exact.setdefault(name, name)
            for alias in aliases:
                self.exact.setdefault(alias, name)
            self.aliases[name] = tuple(aliases)
        # Longest first; among equally long ones (which never match one name), the
        # config's order.
        self.patterns = tuple(sorted(patterns, key=lambda p: -p.length))

    @classmethod
    def of(cls, models: Iterable[Named]) -> ModelNames:
        """From the config's groups."""
        return cls((m.name, tuple(m.aliases)) for m in models)

    def resolve(self, name: str) -> str | None:
        """The name of the group that serves ``name`` (None: none does)."""
        group = self.exact.get(name)
        if group is not None:
            return group
        for pattern in self.patterns:
            if pattern.matches(name):
                return pattern.group
        return None

    def listed(self, groups: Iterable[str]) -> list[str]:
        """The names ``/v1/models`` lists for ``groups`` (in their order): each exact
        group's name, then its aliases; a pattern stands for names no one can list, so
        a pattern group shows only its aliases."""
        names: list[str] = []
        for group in groups:
            if not is_pattern(group):
                names.append(group)
            names += self.aliases.get(group, ())
        return names

    def hint(self, name: str) -> str:
        """Why ``name``, which is no group's name, is not one a config may refer to (an
        allow-list, a window's ``models``, fallbacks name groups): what serves it, if
        anything does ("" otherwise)."""
        group = self.resolve(name)
        if group is None or group == name:
            return ""
        how = "an alias of" if name in self.exact else "served by the pattern"
        return f"; it is {how} {group!r}: name that group"


def overlap(first: str, second: str) -> str | None:
    """A name both patterns match (the shortest one found), or None if no name does.

    A walk over pairs of positions, one in each pattern: a literal character may be
    matched by the same character in the other, or absorbed by the other's ``*``; a
    ``*`` may end. Both ends reached together: the characters taken make a name."""
    start = (0, 0)
    came: dict[tuple[int, int], tuple[tuple[int, int], str]] = {}
    queue = deque([start])
    seen = {start}
    goal = (len(first), len(second))
    while queue:
        at = queue.popleft()
        if at == goal:
            return _walked(came, at)
        for step, taken in _steps(first, second, *at):
            if step not in seen:
                seen.add(step)
                came[step] = (at, taken)
                queue.append(step)
    return None


def _steps(a: str, b: str, i: int, j: int) -> list[tuple[tuple[int, int], str]]:
    """The moves from positions ``i`` of ``a`` and ``j`` of ``b``, with what each takes."""
    x = a[i] if i < len(a) else ""  # "": the pattern's end
    y = b[j] if j < len(b) else ""
    star_x, star_y = x == WILDCARD, y == WILDCARD
    moves = [
        (star_x, (i + 1, j), ""),  # a's * ends
        (star_y, (i, j + 1), ""),
        (star_x and _literal(y), (i, j + 1), y),  # a's * takes b's character
        (star_y and _literal(x), (i + 1, j), x),
        (_literal(x) and x == y, (i + 1, j + 1), x),  # the same character in both
    ]
    return [(step, taken) for possible, step, taken in moves if possible]


def _literal(character: str) -> bool:
    return character not in ("", WILDCARD)


def _walked(
    came: Mapping[tuple[int, int], tuple[tuple[int, int], str]], at: tuple[int, int]
) -> str:
    taken: list[str] = []
    while at in came:
        at, character = came[at]
        taken.append(character)
    return "".join(reversed(taken))


def problems(models: Sequence[object]) -> list[str]:
    """What makes a config's ``models`` entries (raw, as read) ambiguous, each naming its
    field: an alias that is a pattern, its own group's name, another group's name or
    another alias; two patterns as long as each other that can match one name."""
    found: list[str] = []
    owners: dict[str, str] = {}  # an exact name -> the field that holds it first
    entries = [(i, m) for i, m in enumerate(models) if isinstance(m, dict)]
    for i, model in entries:
        name = model.get("name")
        if isinstance(name, str) and not is_pattern(name):
            owners.setdefault(name, f"models[{i}].name")
    for i, model in entries:
        found += _alias_problems(i, model, owners)
    found += _pattern_problems(entries)
    return found


def _alias_problems(i: int, model: dict[Any, Any], owners: dict[str, str]) -> list[str]:
    name = model.get("name")
    aliases = model.get("aliases")
    found: list[str] = []
    for j, alias in enumerate(aliases if isinstance(aliases, list) else []):
        if not isinstance(alias, str):
            continue  # the field's own check says so
        where = f"models[{i}].aliases[{j}]"
        if is_pattern(alias):
            found.append(
                f"{where}: {alias!r} has '*': an alias is an exact name (a pattern is a"
                " group's name)"
            )
        elif alias == name:
            found.append(f"{where}: {alias!r} is the group's own name")
        elif alias in owners:
            other = owners[alias]
            what = "the name of" if other.endswith(".name") else "already"
            found.append(f"{where}: {alias!r} is {what} {other}; a name reaches one group")
        else:
            owners[alias] = where
    return found


def _pattern_problems(entries: list[tuple[int, dict[Any, Any]]]) -> list[str]:
    patterns = [
        (i, Pattern.of(m["name"]))
        for i, m in entries
        if isinstance(m.get("name"), str) and is_pattern(m["name"])
    ]
    found: list[str] = []
    for n, (i, first) in enumerate(patterns):
        for k, second in patterns[n + 1 :]:
            if first.length != second.length or first.group == second.group:
                continue  # a longer one wins; the same name twice is a duplicate
            both = overlap(first.group, second.group)
            if both is not None:
                found.append(
                    f"models[{k}].name: the pattern {second.group!r} overlaps"
                    f" {first.group!r} (models[{i}].name): as long ({first.length}"
                    f" characters besides '*'), both match {both!r}; make one longer or"
                    " name the models exactly"
                )
    return found
