"""The config's YAML, built from libyaml's events: exactly the values PyYAML's safe
loader gives (same types, same order), its errors too, on the repo's files, on the
scalars YAML 1.1 reads as something other than text, and on generated documents."""

from __future__ import annotations

import datetime
import math
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.config import yaml_load

ROOT = Path(__file__).resolve().parent.parent
SAFE = yaml_load.SAFE_LOADER


def typed(value: Any) -> Any:
    """``value`` with every type spelled out: 1, 1.0 and True differ, NaN equals NaN,
    a mapping's order counts."""
    if isinstance(value, dict):
        return ("dict", [(typed(k), typed(v)) for k, v in value.items()])
    if isinstance(value, list):
        return ("list", [typed(v) for v in value])
    if isinstance(value, float) and math.isnan(value):
        return ("float", "nan")
    return (type(value).__name__, value)


def outcome(load: Any, text: str) -> Any:
    try:
        return typed(load(text))
    except yaml.YAMLError as exc:
        return ("error", type(exc).__name__)


def safe_load(text: str) -> Any:
    return yaml.load(text, Loader=SAFE)  # noqa: S506 (a safe loader)


def built_from_events(text: str) -> Any:
    """The fast path alone: raises ``_Fallback`` where PyYAML's load would be asked."""
    return yaml_load.load_from_events(yaml._yaml.CParser(text))


def assert_same(text: str) -> None:
    assert outcome(yaml_load.load, text) == outcome(safe_load, text), text


REPO_FILES = sorted(
    p.relative_to(ROOT).as_posix()
    for pattern in ("config/**/*.yaml", "config/**/*.yml", "deploy/**/*.yaml", "*.yml")
    for p in ROOT.glob(pattern)
)


@pytest.mark.parametrize("name", REPO_FILES)
def test_every_yaml_file_of_the_repo_reads_as_the_safe_loader_reads_it(name: str) -> None:
    assert_same((ROOT / name).read_text(encoding="utf-8"))


@pytest.mark.parametrize(
    "name", ["config/demo.yaml", "config/example.yaml", "config/stack/proxy.yaml"]
)
def test_the_proxy_s_configs_are_built_from_events(name: str) -> None:
    text = (ROOT / name).read_text(encoding="utf-8")
    assert typed(built_from_events(text)) == typed(safe_load(text))


def test_a_long_key_list_is_built_from_events() -> None:
    keys = [{"name": f"k{i}", "key": f"sk-{i}", "rpm": 100, "tpm": 10**8} for i in range(500)]
    text = yaml.safe_dump({"keys": keys, "models": []})
    assert built_from_events(text) == {"keys": keys, "models": []}


TRICKY_PLAIN = [
    # bools by YAML 1.1, as PyYAML reads them
    "yes", "no", "on", "off", "y", "n", "Yes", "NO", "On", "OFF", "true", "False", "TRUE",
    # null
    "~", "null", "Null", "NULL", "",
    # ints: bases, underscores, signs, sexagesimal
    "0", "-0", "+12", "0x1f", "0X1F", "0o17", "017", "0b101", "1_000", "1:30", "190:20:30",
    # floats
    "1.5", "-1.5e3", "1e3", "6.8523015e+5", ".inf", "-.Inf", "+.INF", ".nan", ".NaN", "1_0.5",
    "1:30.5", ".", "._",
    # timestamps: a date, a time with zone, spaced
    "2002-12-14", "2001-12-14t21:59:43.10-05:00", "2001-12-14 21:59:43.10 -5",
    "2001-12-15T02:59:43.1Z",
    # text that looks close
    "yes please", "0x", "1.2.3", "12:30:45abc", "-", "+", "nan", "inf", "0b", "1__0", "1e",
    "2002-1-1x", "o", "t", "f", "=", "<<x", "key-12", "sk-0001", "ünïcode", "日本",
]  # fmt: skip


@pytest.mark.parametrize("scalar", TRICKY_PLAIN)
def test_a_plain_scalar_means_what_it_means_to_pyyaml(scalar: str) -> None:
    assert_same(f"value: {scalar}\nlist: [{scalar}]\n{scalar or '~'}: key\n")


@pytest.mark.parametrize(
    "text",
    [
        "",
        "---\n",
        "--- 3\n...\n",
        "# only a comment\n",
        "a: 'yes'\nb: \"0x1f\"\nc: |\n  two\n  lines\nd: >\n  folded\n  text\n",
        "a: {}\nb: []\nc: {x: [1, {y: ~}]}\n",
        "a: 1\na: 2\nb: 3\n",
        "1: int\n1.0: float\ntrue: bool\n~: null\n",
        "plain: multi\n  line text\n",
        "%YAML 1.1\n---\na: 1\n",
    ],
)
def test_plain_documents_are_built_from_events(text: str) -> None:
    assert typed(built_from_events(text)) == typed(safe_load(text))


@pytest.mark.parametrize(
    "text",
    [
        "base: &b {rpm: 1}\nkey:\n  <<: *b\n  tpm: 2\n",  # anchor, alias, merge
        "a: &x 1\nb: *x\n",
        "a: !!str 123\nb: !!int '7'\nc: !!float 1\n",  # tags
        "a: !!binary aGVsbG8=\n",
        "a: !!set {x, y}\nb: !!omap [{x: 1}]\n",
        "a: !!python/object:os.system x\n",  # the safe loader refuses it
        "a: !custom x\n",
        "? [a, b]\n: complex key\n",
        "? {a: 1}\n: complex key\n",
        "<<: {a: 1}\nb: 2\n",
        "a: =\n",
        "--- 1\n--- 2\n",  # two documents
        "a: [1, 2\n",  # a syntax error
        "a:\n\t- b\n",
        "key: value: more\n",
    ],
)
def test_anything_beyond_plain_data_gives_what_pyyaml_gives(text: str) -> None:
    assert_same(text)


def test_a_timestamp_is_built_by_pyyaml_s_constructor() -> None:
    assert yaml_load.load("at: 2001-12-14 21:59:43.10 -5\nday: 2002-12-14\n") == {
        "at": datetime.datetime(
            2001, 12, 14, 21, 59, 43, 100000, tzinfo=datetime.timezone(-datetime.timedelta(hours=5))
        ),
        "day": datetime.date(2002, 12, 14),
    }


# --- generated documents ---------------------------------------------------------

# Words that make plain scalars of every kind, joined into documents written by hand (so
# that they stay plain: safe_dump would quote the tricky ones).
_WORDS = st.sampled_from([s for s in TRICKY_PLAIN if s]) | st.from_regex(
    r"[A-Za-z0-9_.+\-~:]{1,8}", fullmatch=True
)


def _block(depth: int) -> st.SearchStrategy[str]:
    """A YAML value written at ``depth`` (indentation), in block or flow style."""
    flow = st.recursive(
        _WORDS,
        lambda inner: (
            st.lists(inner, max_size=3).map(lambda xs: "[" + ", ".join(xs) + "]")
            | st.lists(st.tuples(_WORDS, inner), max_size=3).map(
                lambda kvs: "{" + ", ".join(f"{k}: {v}" for k, v in kvs) + "}"
            )
        ),
        max_leaves=6,
    )
    if depth >= 3:
        return flow.map(lambda v: " " + v)
    pad = "  " * (depth + 1)
    mapping = st.lists(
        st.tuples(_WORDS, st.deferred(lambda: _block(depth + 1))), min_size=1, max_size=4
    ).map(lambda kvs: "".join(f"\n{pad}{k}:{v}" for k, v in kvs))
    sequence = st.lists(st.deferred(lambda: _block(depth + 1)), min_size=1, max_size=4).map(
        lambda vs: "".join(f"\n{pad}-{v}" for v in vs)
    )
    return flow.map(lambda v: " " + v) | mapping | sequence


_DOCUMENTS = st.lists(st.tuples(_WORDS, _block(0)), min_size=1, max_size=5).map(
    lambda kvs: "".join(f"{k}:{v}\n" for k, v in kvs)
)


@pytest.mark.slow
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_DOCUMENTS)
def test_generated_plain_documents_read_as_pyyaml_reads_them(text: str) -> None:
    assert_same(text)


_DATA = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()
    | st.text(max_size=12)
    | st.sampled_from(TRICKY_PLAIN),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.text(max_size=6) | st.integers() | st.booleans(), inner, max_size=4)
    ),
    max_leaves=20,
)


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(_DATA, st.sampled_from([None, True, False]), st.sampled_from([None, '"', "'", "|"]))
def test_dumped_data_reads_as_pyyaml_reads_it(
    data: Any, flow: bool | None, style: str | None
) -> None:
    assert_same(yaml.safe_dump({"data": data}, default_flow_style=flow, default_style=style))


# --- the key list read by line ---------------------------------------------------

# A key entry's field as written by hand: a plain word (tricky ones included), or quoted.
_FIELD_VALUES = (
    _WORDS
    | st.from_regex(r"'[ -&(-~]{0,6}'", fullmatch=True)
    | st.from_regex(r'"[ !#-\[\]-~]{0,6}"', fullmatch=True)
    | st.from_regex(r"'[^\n]{0,4}'|\"[^\n]{0,4}\"", fullmatch=True)
)
_FIELD_NAMES = st.sampled_from(["name", "key", "rpm", "yes", "null", "1", "on", "k_1"]) | _WORDS
_ENTRIES = st.lists(
    st.lists(st.tuples(_FIELD_NAMES, _FIELD_VALUES), min_size=1, max_size=4),
    min_size=1,
    max_size=4,
)


def _key_list(entries: list[list[tuple[str, str]]], indent: str) -> str:
    lines = []
    for entry in entries:
        for i, (field, value) in enumerate(entry):
            lines.append(f"{indent}{'- ' if i == 0 else '  '}{field}: {value}\n")
    return "".join(lines)


@pytest.mark.slow
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    _ENTRIES,
    st.sampled_from(["", "  ", " "]),
    st.sampled_from(["", "models: []\n", "a: 1\n"]),
    st.sampled_from(["", "models: []\n", "other:\n  - x\n", "# note\n", "keys: 1\n", "---\n"]),
)
def test_a_key_list_written_by_hand_reads_as_pyyaml_reads_it(
    entries: list[list[tuple[str, str]]], indent: str, before: str, after: str
) -> None:
    assert_same(f"{before}keys:\n{_key_list(entries, indent)}{after}")


@pytest.mark.slow
@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.dictionaries(
            st.sampled_from(["name", "key", "rpm", "tpm", "team"]),
            st.integers() | st.text(max_size=8) | st.booleans() | st.none() | st.floats(),
            min_size=1,
        ),
        min_size=1,
        max_size=5,
    ),
    st.sampled_from([None, '"', "'"]),
)
def test_a_dumped_key_list_reads_as_pyyaml_reads_it(
    keys: list[dict[str, Any]], style: str | None
) -> None:
    assert_same(yaml.safe_dump({"keys": keys, "models": []}, default_style=style))


def test_the_commonest_key_list_is_read_by_line() -> None:
    keys = [{"name": f"k{i}", "key": f"sk-{i}", "rpm": 100, "tpm": 10**8} for i in range(500)]
    text = yaml.safe_dump({"admin": {"keys": ["a"]}, "keys": keys, "models": []})
    split = yaml_load.split_key_list(text)
    assert split is not None
    assert split[1] == keys
    assert yaml_load.load(text) == safe_load(text)


@pytest.mark.parametrize(
    "text",
    [
        "keys:\n- name: a\n  # a comment\n  rpm: 1\n",
        "keys:\n- name: a\n  models: [m]\n",
        "keys:\n- name: a\n  models:\n  - m\n",
        "keys:\n- name: a\n  rpm: 1 # a comment\n",
        "keys:\n- name: a\n\trpm: 1\n",
        "keys:\n- name: a\n  key: 'it''s'\n",
        'keys:\n- name: a\n  key: "a\\tb"\n',
        "keys:\n- name: a\n  rpm: 1",  # no final line break
        "keys:\n  rpm: 1\n",
        "keys:\n- name: a\n'keys': 2\n",
        "keys:\n- name: &x a\n",
        "keys:\n- name: a\n...\n",
    ],
)
def test_anything_else_in_the_list_is_left_to_the_events(text: str) -> None:
    assert yaml_load.split_key_list(text) is None
    assert_same(text)
