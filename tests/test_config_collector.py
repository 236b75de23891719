"""load_settings holds the garbage collector off while it reads: its passes over a large
document's objects doubled start-up with 100,000 keys."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from proxy.config.settings import load_settings


@pytest.fixture
def config_file(tmp_path: Path) -> Path:
    keys = [{"name": f"k{i}", "key": f"sk-{i}", "rpm": 60} for i in range(2000)]
    models = [{"name": "m", "deployments": [{"id": "a", "base_url": "http://u/v1"}]}]
    path = tmp_path / "proxy.yaml"
    path.write_text(yaml.safe_dump({"keys": keys, "models": models}))
    return path


@pytest.fixture
def collections() -> Iterator[list[int]]:
    seen: list[int] = []

    def note(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            seen.append(info["generation"])

    gc.callbacks.append(note)
    try:
        yield seen
    finally:
        gc.callbacks.remove(note)


@pytest.mark.slow
def test_no_collection_runs_while_a_config_is_read(
    config_file: Path, collections: list[int]
) -> None:
    assert gc.isenabled()
    settings = load_settings(config_file)
    assert len(settings.keys) == 2000
    assert collections == []
    assert gc.isenabled()
