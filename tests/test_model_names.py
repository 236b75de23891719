"""The resolution of a client's model name to a group (proxy/config/model_names.py, pure): exact
names (a group's, an alias) win, then the longest pattern; ``*`` is the one wildcard;
what a config may not say (an alias twice, an alias that is a group's name, two patterns
as long that match one name) is reported naming its field."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.config.model_names import ModelNames, Pattern, is_pattern, overlap, problems
from proxy.config.settings import ConfigError, parse_settings

GROUPS: list[tuple[str, list[str]]] = [
    ("claude-sonnet", ["claude-sonnet-4-5", "claude-opus-4-8[1m]"]),
    ("claude-*", []),
    ("claude-opus-*", ["opus"]),
    ("gpt-4o", []),
    ("gpt-4o*", ["gpt4"]),
    ("*-preview", []),
]


@pytest.fixture
def names() -> ModelNames:
    return ModelNames(GROUPS)


@pytest.mark.parametrize(
    ("asked", "group"),
    [
        ("claude-sonnet", "claude-sonnet"),  # a group's name
        ("claude-sonnet-4-5", "claude-sonnet"),  # an alias
        ("claude-opus-4-8[1m]", "claude-sonnet"),  # an alias with brackets: exact
        ("opus", "claude-opus-*"),  # a pattern group's alias
        ("gpt4", "gpt-4o*"),
        ("gpt-4o", "gpt-4o"),  # exact beats the pattern gpt-4o* that matches it too
        ("gpt-4o-mini", "gpt-4o*"),
        ("claude-opus-4-8", "claude-opus-*"),  # the longest pattern wins over claude-*
        ("claude-opus-", "claude-opus-*"),  # * matches nothing too
        ("claude-haiku-4-5-20251001", "claude-*"),
        ("claude-sonnet-4-5-20250929", "claude-*"),  # not the alias: exact means exact
        ("claude-", "claude-*"),
        ("claude-opus-preview", "claude-opus-*"),  # 12 characters beat *-preview's 8
        ("claude-preview", "*-preview"),  # 8 beat claude-*'s 7
        ("gemini-preview", "*-preview"),
    ],
)
def test_a_name_resolves_to_its_group(names: ModelNames, asked: str, group: str) -> None:
    assert names.resolve(asked) == group


@pytest.mark.parametrize("asked", ["", "claude", "Claude-sonnet", "gpt-4", "x-preview2", "*"])
def test_a_name_nothing_serves_resolves_to_none(names: ModelNames, asked: str) -> None:
    assert names.resolve(asked) is None


def test_the_order_of_the_groups_does_not_change_the_winner() -> None:
    for groups in (GROUPS, list(reversed(GROUPS))):
        names = ModelNames(groups)
        assert names.resolve("claude-opus-4-8") == "claude-opus-*"
        assert names.resolve("gpt-4o") == "gpt-4o"
        assert names.resolve("claude-preview") == "*-preview"


def test_only_the_star_is_a_wildcard() -> None:
    names = ModelNames([("model-?", []), ("model-[ab]", []), ("m*[1m]", [])])
    assert not is_pattern("claude-opus-4-8[1m]")
    assert names.resolve("model-?") == "model-?"  # a name, exactly
    assert names.resolve("model-x") is None  # ? is no wildcard
    assert names.resolve("model-[ab]") == "model-[ab]"
    assert names.resolve("model-a") is None  # [ab] is no character class
    assert names.resolve("my-model[1m]") == "m*[1m]"  # brackets literal within a pattern
    assert names.resolve("my-model1") is None


@pytest.mark.parametrize(
    ("pattern", "name", "matches"),
    [
        ("*", "", True),
        ("*", "anything at all", True),
        ("a*", "a", True),
        ("*a", "ba", True),
        ("a*a", "a", False),  # one a cannot be both ends
        ("a*a", "aa", True),
        ("a*b*c", "abc", True),
        ("a*b*c", "a-c-b-c", True),
        ("a*b*c", "acb", False),
        ("*ab*ab*", "xabyab", True),
        ("*ab*ab*", "xaby", False),
        ("a**b", "ab", True),
        ("*.*", "gpt.4", True),  # . is literal
        ("*.*", "gpt4", False),
    ],
)
def test_a_pattern_matches(pattern: str, name: str, matches: bool) -> None:
    assert Pattern.of(pattern).matches(name) is matches


def test_a_patterns_length_is_its_characters_besides_the_star() -> None:
    assert Pattern.of("claude-*").length == 7
    assert Pattern.of("a*b*c").length == 3
    assert Pattern.of("*").length == 0


@pytest.mark.parametrize(
    ("first", "second", "overlaps"),
    [
        ("claude-*", "*-4-5", True),
        ("claude-*", "gemini*", False),
        ("a*", "*b", True),
        ("a*", "b*", False),
        ("*a", "*b", False),
        ("a*c", "ab*", True),
        ("a*b", "a*c", False),
        ("x*y*z", "*y*", True),
        ("*", "abc", True),
        ("ab*", "ab*", True),
    ],
)
def test_two_patterns_overlap_when_some_name_matches_both(
    first: str, second: str, overlaps: bool
) -> None:
    both = overlap(first, second)
    assert (both is not None) is overlaps
    if both is not None:  # the name it gives is one both match
        assert Pattern.of(first).matches(both) or not is_pattern(first)
        assert Pattern.of(second).matches(both) or not is_pattern(second)
    assert (overlap(second, first) is not None) is overlaps  # either way round


def test_overlap_gives_a_shortest_witness() -> None:
    assert overlap("claude-*", "*-4-5") == "claude-4-5"
    assert overlap("a*", "*b") == "ab"


def _models(*entries: dict[str, Any]) -> list[object]:
    return [{"deployments": [], **e} for e in entries]


def test_equally_long_patterns_that_match_one_name_are_reported() -> None:
    found = problems(_models({"name": "claude-*"}, {"name": "*-4-5-20"}, {"name": "gemini*x"}))
    assert found == [
        "models[1].name: the pattern '*-4-5-20' overlaps 'claude-*' (models[0].name): as"
        " long (7 characters besides '*'), both match 'claude-4-5-20'; make one longer or"
        " name the models exactly"
    ]


def test_patterns_of_different_lengths_may_overlap_the_longest_wins() -> None:
    assert problems(_models({"name": "claude-*"}, {"name": "claude-opus-*"}, {"name": "*"})) == []


def test_alias_problems_name_their_field() -> None:
    found = problems(
        _models(
            {"name": "claude-sonnet", "aliases": ["sonnet", "claude-sonnet", "c*"]},
            {"name": "claude-opus", "aliases": ["sonnet", "claude-sonnet", "opus"]},
            {"name": "claude-*", "aliases": ["opus", "claude-haiku"]},
        )
    )
    assert found == [
        "models[0].aliases[1]: 'claude-sonnet' is the group's own name",
        "models[0].aliases[2]: 'c*' has '*': an alias is an exact name (a pattern is a"
        " group's name)",
        "models[1].aliases[0]: 'sonnet' is already models[0].aliases[0]; a name reaches one group",
        "models[1].aliases[1]: 'claude-sonnet' is the name of models[0].name; a name"
        " reaches one group",
        "models[2].aliases[0]: 'opus' is already models[1].aliases[2]; a name reaches one group",
    ]


def test_an_alias_twice_in_one_group_is_reported() -> None:
    found = problems(_models({"name": "m", "aliases": ["a", "a"]}))
    assert found == [
        "models[0].aliases[1]: 'a' is already models[0].aliases[0]; a name reaches one group"
    ]


def test_an_alias_a_pattern_also_matches_is_fine_exact_wins() -> None:
    assert problems(_models({"name": "claude-*"}, {"name": "s", "aliases": ["claude-s"]})) == []


def test_listed_names_are_exact_ones_a_pattern_group_shows_its_aliases(
    names: ModelNames,
) -> None:
    assert names.listed(["claude-sonnet", "claude-*", "claude-opus-*", "gpt-4o"]) == [
        "claude-sonnet",
        "claude-sonnet-4-5",
        "claude-opus-4-8[1m]",
        "opus",
        "gpt-4o",
    ]


def _config(models: list[dict[str, Any]], **more: Any) -> dict[str, Any]:
    deployment = {"base_url": "http://127.0.0.1:9/v1"}
    return {
        "models": [
            {**m, "deployments": [{**deployment, "id": f"d{i}"}]} for i, m in enumerate(models)
        ],
        **more,
    }


def _problems(data: dict[str, Any]) -> list[str]:
    with pytest.raises(ConfigError) as raised:
        parse_settings(data, "models.yaml", env={})
    return raised.value.problems


def test_the_config_reports_every_problem_of_names_at_once() -> None:
    found = _problems(
        _config(
            [
                {"name": "claude-sonnet", "aliases": ["sonnet"]},
                {"name": "claude-*"},
                {"name": "*-sonnet", "aliases": ["sonnet"]},
            ]
        )
    )
    assert found == [
        "models[2].aliases[0]: 'sonnet' is already models[0].aliases[0]; a name reaches one group",
        "models[2].name: the pattern '*-sonnet' overlaps 'claude-*' (models[1].name): as"
        " long (7 characters besides '*'), both match 'claude-sonnet'; make one longer or"
        " name the models exactly",
    ]


def test_references_name_groups_and_are_told_what_serves_a_name() -> None:
    """An allow-list, a window's ``models`` and fallbacks name groups: an alias or a name
    a pattern serves is an error that says which group to name (a key allowed a pattern
    group is allowed every name it serves)."""
    found = _problems(
        _config(
            [{"name": "claude-sonnet", "aliases": ["sonnet"]}, {"name": "claude-*"}],
            keys=[
                {
                    "name": "a",
                    "key": "k",
                    "models": ["sonnet", "claude-*"],
                    "limits": [{"requests": 1, "per": "1m", "models": ["claude-opus-4"]}],
                }
            ],
            routing={"fallbacks": {"claude-sonnet": ["claude-haiku"]}},
        )
    )
    assert found == [
        "keys[0].models: unknown model 'sonnet'; it is an alias of 'claude-sonnet': name"
        " that group",
        "keys[0].limits[0].models: unknown model 'claude-opus-4'; it is served by the"
        " pattern 'claude-*': name that group",
        "routing.fallbacks.claude-sonnet: unknown model 'claude-haiku'; it is served by the"
        " pattern 'claude-*': name that group",
    ]


def test_a_valid_config_keeps_its_aliases() -> None:
    settings = parse_settings(
        _config([{"name": "claude-sonnet", "aliases": ["claude-opus-4-8[1m]"]}]), "x", env={}
    )
    assert settings.models[0].aliases == ["claude-opus-4-8[1m]"]
    assert ModelNames.of(settings.models).resolve("claude-opus-4-8[1m]") == "claude-sonnet"
