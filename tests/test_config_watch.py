"""``server.watch_config``: a config file changed in place is reloaded without a signal,
as a Kubernetes ConfigMap volume changes it (the kubelet swaps the ``..data`` symlink to a
new directory). Off the request path: one task per process, a ``stat`` per interval."""

from __future__ import annotations

import asyncio
import itertools
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import yaml
from support.proxy_server import ProxyProcess
from support.waiting import wait_until

from proxy.fake_upstream import FakeUpstreamConfig, FakeUpstreamHandle, run_in_thread
from proxy.process.config_watch import ChangeDetector, ConfigWatcher, FileSignature, file_signature

OLD_KEY, NEW_KEY = "sk-watch-old", "sk-watch-new"


class ConfigMapVolume:
    """A directory laid out as the kubelet lays out a ConfigMap volume: ``config.yaml``
    -> ``..data/config.yaml``, ``..data`` -> a timestamped directory; an update writes a
    new directory, renames a new ``..data`` symlink over the old one (atomic), and removes
    the old directory."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.root.mkdir()
        self._versions = itertools.count()
        self.path = root / "config.yaml"

    def write(self, text: str) -> None:
        version = f"..2026_11_25_10_00_00.{next(self._versions)}"
        (self.root / version).mkdir()
        (self.root / version / "config.yaml").write_text(text)
        data = self.root / "..data"
        old = os.readlink(data) if data.is_symlink() else None
        staged = self.root / "..data_tmp"
        staged.symlink_to(version)
        os.replace(staged, data)
        if old is not None:
            shutil.rmtree(self.root / old)
        if not self.path.is_symlink():
            self.path.symlink_to("..data/config.yaml")


# -- the pure part: when a look at the file means "reload" -----------------------------


def test_the_same_file_is_no_change() -> None:
    detector = ChangeDetector((1, 10, 100, 5))
    assert not detector.changed((1, 10, 100, 5))


def test_another_file_is_one_change_then_the_new_one_is_the_reference() -> None:
    detector = ChangeDetector((1, 10, 100, 5))
    assert detector.changed((1, 11, 100, 5))
    assert not detector.changed((1, 11, 100, 5))


def test_a_missing_file_keeps_the_config_in_force_and_its_return_is_compared() -> None:
    detector = ChangeDetector((1, 10, 100, 5))
    assert not detector.changed(None)
    assert not detector.changed((1, 10, 100, 5))  # the same file back: nothing to do
    assert not detector.changed(None)
    assert detector.changed((1, 12, 200, 6))


def test_a_file_that_appears_after_start_is_a_change() -> None:
    assert ChangeDetector(None).changed((1, 10, 100, 5))


def test_the_signature_follows_a_configmap_symlink_swap(tmp_path: Path) -> None:
    volume = ConfigMapVolume(tmp_path / "cm")
    volume.write("a: 1\n")
    before = file_signature(str(volume.path))
    volume.write("a: 1\n")  # the same bytes in a new directory: another file
    after = file_signature(str(volume.path))
    assert before is not None and after is not None and before != after
    assert file_signature(str(tmp_path / "absent.yaml")) is None


async def test_the_watcher_reloads_once_per_change_and_survives_a_failing_reload() -> None:
    # The file as the running config was read from it, then one look per interval.
    seen: FileSignature = (1, 1, 1, 1)
    looks: list[FileSignature] = [(1, 1, 1, 1), (1, 2, 1, 1), None, (1, 2, 1, 1), (1, 3, 1, 1)]
    paths: set[str] = set()
    reloads = 0
    exhausted = asyncio.Event()

    async def reload() -> None:
        nonlocal reloads
        reloads += 1
        if reloads == 1:
            raise RuntimeError("the first reload fails")

    async def sleep(seconds: float) -> None:
        assert seconds == 5.0
        if not looks:
            exhausted.set()
            await asyncio.Event().wait()  # here until the watcher is closed

    def look(path: str) -> FileSignature:
        paths.add(path)
        return looks.pop(0)

    path = "/etc/llm-proxy/config.yaml"
    watcher = ConfigWatcher(path, seen, 5.0, reload, signature=look, sleep=sleep)
    watcher.start()
    await asyncio.wait_for(exhausted.wait(), 10)
    await watcher.aclose()
    assert reloads == 2  # (1, 2, 1, 1) and (1, 3, 1, 1); not the missing file's return
    assert paths == {"/etc/llm-proxy/config.yaml"}


# -- a real process: the file changes, the reload metric moves -------------------------


@pytest.fixture
def upstream() -> Iterator[FakeUpstreamHandle]:
    with run_in_thread(FakeUpstreamConfig(port=0)) as handle:
        yield handle


def _config(upstream: FakeUpstreamHandle, keys: list[str]) -> dict[str, Any]:
    return {
        "keys": [{"name": key, "key": key} for key in keys],
        "models": [
            {
                "name": "m",
                "deployments": [{"id": "d1", "base_url": upstream.base_url, "api_key": "up"}],
            }
        ],
        "server": {"watch_config": "100ms"},
    }


def _reloads(proxy: ProxyProcess, result: str) -> float:
    for line in httpx.get(f"{proxy.url}/metrics", timeout=5).text.splitlines():
        if line.startswith(f'llmproxy_config_reloads_total{{result="{result}"}}'):
            return float(line.split()[-1])
    return 0.0


def _status(proxy: ProxyProcess, key: str) -> int:
    client = openai.OpenAI(base_url=proxy.base_url, api_key=key, max_retries=0)
    try:
        client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=5
        )
    except openai.APIStatusError as exc:
        return exc.status_code
    return 200


def _started(proxy: ProxyProcess) -> int:
    return proxy.logs().count("Application startup complete.")


@pytest.mark.slow
@pytest.mark.parametrize("workers", [1, 2])
def test_a_configmap_update_is_reloaded_by_every_worker_without_a_signal(
    tmp_path: Path, upstream: FakeUpstreamHandle, workers: int
) -> None:
    volume = ConfigMapVolume(tmp_path / "configmap")
    volume.write(yaml.safe_dump(_config(upstream, [OLD_KEY])))
    proxy = ProxyProcess(_config(upstream, [OLD_KEY]), tmp_path, workers=workers)
    proxy.config_path = volume.path  # serve --config the ConfigMap's path
    with proxy:
        # Ready answers from one worker; a worker still starting would read the new file.
        wait_until(lambda: _started(proxy) == workers, 15.0, "every worker started")
        assert _status(proxy, NEW_KEY) == 401

        volume.write(yaml.safe_dump(_config(upstream, [OLD_KEY, NEW_KEY])))
        # Each worker counts 1/workers of a reload: 1.0 once every one has reloaded.
        wait_until(lambda: _reloads(proxy, "success") == 1.0, 15.0, "the watched reload")
        assert _status(proxy, NEW_KEY) == 200

        volume.write("models: []\n")  # invalid: counted, nothing changes
        wait_until(lambda: _reloads(proxy, "failure") == 1.0, 15.0, "the failed reload")
        assert _status(proxy, NEW_KEY) == 200
        assert _reloads(proxy, "success") == 1.0
    assert "config file" in proxy.logs() and "changed: reloading" in proxy.logs()
