"""A large config file is parsed by a child process for a reload (libyaml would hold the
GIL, and so the event loop, for the whole parse): the same document as read in place,
and the same problems."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from proxy.config import read as config_read
from proxy.config.settings import ConfigError, read_document


@pytest.fixture(autouse=True)
def everything_is_large(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(config_read, "APART_OVER", 10)


@pytest.mark.slow
def test_the_document_read_apart_is_the_one_read_in_place(tmp_path: Path) -> None:
    document = {
        "keys": [{"name": f"k{i}", "key": f"sk-{i}", "rpm": i + 1} for i in range(2500)],
        "models": [{"name": "m", "deployments": [{"id": "d", "base_url": "http://x/v1"}]}],
        "routing": {"max_wait": "2s"},
    }
    path = tmp_path / "proxy.yaml"
    path.write_text(yaml.safe_dump(document))
    assert config_read.read_document_apart(str(path)) == read_document(path) == document


def test_a_file_without_keys_reads_apart_too(tmp_path: Path) -> None:
    path = tmp_path / "proxy.yaml"
    path.write_text("models: []\nkeys: null\n")
    assert config_read.read_document_apart(str(path)) == {"models": [], "keys": None}


@pytest.mark.slow
def test_a_yaml_mistake_is_named_as_in_place(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("models:\n\t- name: m\n" + "#" * 20)
    with pytest.raises(ConfigError) as apart:
        config_read.read_document_apart(str(path))
    with pytest.raises(ConfigError) as in_place:
        read_document(path)
    assert apart.value.problems == in_place.value.problems
    assert "a tab" in apart.value.problems[0]


def test_what_json_cannot_carry_is_read_in_place(tmp_path: Path) -> None:
    path = tmp_path / "proxy.yaml"
    path.write_text("models: []\nwhen: 2024-10-21\n1: one\n")
    assert config_read.read_document_apart(str(path)) == read_document(path)


@pytest.mark.parametrize("value", [".inf", "-.Inf", ".nan", "1.0e+400"])
def test_a_float_json_cannot_carry_is_read_in_place(tmp_path: Path, value: str) -> None:
    path = tmp_path / "proxy.yaml"
    path.write_text(f"models: []\nkeys:\n- name: k\n  weight: {value}\n")
    apart = config_read.read_document_apart(str(path))
    assert repr(apart) == repr(read_document(path))
    assert apart["keys"][0]["weight"] != apart["keys"][0]["weight"] or abs(
        apart["keys"][0]["weight"]
    ) == float("inf")


def test_a_name_that_merely_contains_inf_is_read_apart(tmp_path: Path) -> None:
    path = tmp_path / "proxy.yaml"
    path.write_text("models: []\nkeys:\n- name: example.info\n  team: x.nano\n")
    assert not config_read._NOT_FINITE.search(path.read_text())
    assert config_read.read_document_apart(str(path)) == read_document(path)
