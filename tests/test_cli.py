"""The command line: check-config, and the README's demo working as written."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from support.proxy_server import free_port
from support.raw_upstream import Conversation, answer
from support.scripted_upstream import ScriptedUpstream
from support.waiting import wait_ready, wait_until

from proxy.process.cli import main

ROOT = Path(__file__).parent.parent


def test_check_config_prints_a_summary(capsys: object) -> None:
    assert main(["check-config", str(ROOT / "config" / "demo.yaml")]) == 0
    out = capsys.readouterr().out  # type: ignore[attr-defined]
    assert "OK" in out and "gpt-4o-mini: fake-openai" in out


def test_check_config_reports_ambiguous_model_names_and_lists_aliases(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Overlapping patterns, an alias twice or equal to a group's name: problems naming
    their field (exit 1); a valid file's summary names each group's aliases."""
    deployment = "    deployments: [{{id: {}, base_url: 'http://127.0.0.1:9/v1'}}]\n"
    bad = tmp_path / "names.yaml"
    bad.write_text(
        "models:\n  - name: m\n    aliases: [a, a]\n"
        + deployment.format("d1")
        + "  - name: 'gpt-*'\n    aliases: [m]\n"
        + deployment.format("d2")
        + "  - name: '*-4o-'\n"
        + deployment.format("d3")
    )
    assert main(["check-config", str(bad)]) == 1
    err = capsys.readouterr().err
    assert "3 problem(s)" in err
    assert "models[0].aliases[1]: 'a' is already models[0].aliases[0]" in err
    assert "models[1].aliases[0]: 'm' is the name of models[0].name" in err
    assert "models[2].name: the pattern '*-4o-' overlaps 'gpt-*' (models[1].name)" in err
    good = tmp_path / "good.yaml"
    good.write_text("models:\n  - name: m\n    aliases: [a, 'b[1m]']\n" + deployment.format("d"))
    assert main(["check-config", str(good)]) == 0
    assert "  - m (also a, b[1m]): d" in capsys.readouterr().out


def test_check_config_lists_every_problem_and_exits_1(tmp_path: Path, capsys: object) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(
        "models:\n  - name: m\n    deployments:\n      - id: d\n        base_url: nope\n"
        "        rpm: zero\nrouting:\n  speed: fast\n"
    )
    assert main(["check-config", str(path)]) == 1
    err = capsys.readouterr().err  # type: ignore[attr-defined]
    assert "3 problem(s)" in err
    assert "models[0].deployments[0].base_url" in err
    assert "models[0].deployments[0].rpm" in err
    assert "routing.speed: unknown key" in err


def test_check_config_warns_about_what_is_valid_but_probably_not_meant(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An OpenAI base_url without /v1 passes (exit 0) with a warning naming the field."""
    path = tmp_path / "openai.yaml"
    path.write_text(
        "models:\n  - name: m\n    deployments:\n"
        "      - {id: d, base_url: 'https://api.openai.com', api_key: '${OPENAI_KEY:-x}'}\n"
    )
    assert main(["check-config", str(path)]) == 0
    captured = capsys.readouterr()
    assert f"{path}: warning: models[0].deployments[0].base_url" in captured.err
    assert "https://api.openai.com/v1" in captured.err and "OK" in captured.out


def test_check_config_warns_about_a_dummy_key_and_a_local_server_without_its_api(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A local server answering 404 at every endpoint (a base_url missing its /v1) and
    a dummy key (not redacted from answers): valid (exit 0), each named in a warning."""

    async def not_found(conversation: Conversation) -> None:
        await conversation.send(answer(b"404 page not found", status="404 Not Found"))

    path = tmp_path / "local.yaml"
    with ScriptedUpstream(not_found) as upstream:
        path.write_text(
            "models:\n  - name: m\n    deployments:\n"
            f"      - {{id: local, base_url: '{upstream.url}', api_key: EMPTY}}\n"
        )
        assert main(["check-config", str(path)]) == 0
    captured = capsys.readouterr()
    assert (
        f"{path}: warning: models[0].deployments[0].api_key: too short or too common"
        in captured.err
    )
    assert (
        f"{path}: warning: deployment local: {upstream.url}/chat/completions answers 404"
        in captured.err
    )
    assert "OK" in captured.out


@pytest.mark.slow
def test_python_dash_m_proxy_is_the_cli() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "proxy", "check-config", str(ROOT / "config" / "demo.yaml")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr


@pytest.mark.slow
def test_readme_sdk_example_works_against_the_demo(tmp_path: Path) -> None:
    port, upstream_port = free_port(), free_port()
    env = {**os.environ, "LLM_PROXY_DEMO_UPSTREAM_PORT": str(upstream_port)}
    log = (tmp_path / "demo.log").open("wb")
    demo = subprocess.Popen(
        [sys.executable, "-m", "proxy", "serve", "--port", str(port)],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
    )
    try:
        wait_ready(f"http://127.0.0.1:{port}/health/ready", demo)
        readme = (ROOT / "README.md").read_text()
        example = re.search(r"```python\n(.*?)```", readme, re.S)
        assert example is not None
        code = example.group(1).replace("127.0.0.1:8000", f"127.0.0.1:{port}")
        result = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
        )
        assert result.returncode == 0, result.stderr
        lines = [line for line in result.stdout.splitlines() if line.strip()]
        assert len(lines) == 2  # a completion, then a streamed completion
        # The README's `.venv/bin/python example.py`: the same example, as a file.
        env = {k: v for k, v in os.environ.items() if k != "OPENAI_API_KEY"}
        env["OPENAI_BASE_URL"] = f"http://127.0.0.1:{port}/v1"  # the demo key: its default
        result = subprocess.run(
            [sys.executable, str(ROOT / "example.py")],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
        )
        assert result.returncode == 0, result.stderr
        assert len([line for line in result.stdout.splitlines() if line.strip()]) == 2
    finally:
        os.killpg(demo.pid, signal.SIGTERM)
        demo.wait(timeout=15)


def test_example_py_is_the_readmes_example() -> None:
    """Line for line, but for where the client points (OPENAI_BASE_URL, for the test)."""
    readme = (ROOT / "README.md").read_text()
    example = re.search(r"```python\n(.*?)```", readme, re.S)
    assert example is not None
    documented = [
        line for line in example.group(1).splitlines() if not line.startswith("client = OpenAI(")
    ]
    in_file = (ROOT / "example.py").read_text().splitlines()
    lines = iter(in_file)
    missing = [line for line in documented if line not in lines]  # in order
    assert missing == [], missing


def _without_proxy_variables() -> dict[str, str]:
    """This environment without the LLM_PROXY_* variables a developer may have set."""
    return {k: v for k, v in os.environ.items() if not k.startswith("LLM_PROXY_")}


def _failed_start(argv: list[str], env: dict[str, str]) -> list[str]:
    """``python -m proxy ARGV``, which must stop at start-up (exit 1): its stderr's lines."""
    result = subprocess.run(
        [sys.executable, "-m", "proxy", *argv],
        capture_output=True,
        text=True,
        timeout=30,
        env=env,
    )
    assert result.returncode == 1, result.stderr
    return result.stderr.strip().splitlines()


def _listening() -> socket.socket:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    return s


@pytest.mark.slow
@pytest.mark.parametrize("what", ["proxy", "demo-upstream", "fake-upstream"])
def test_a_busy_port_is_one_line_saying_how_to_move_it(what: str) -> None:
    with _listening() as taken:
        port = taken.getsockname()[1]
        env = dict(os.environ)
        if what == "proxy":
            argv, fix = ["serve", "--port", str(port)], "LLM_PROXY_PORT"
        elif what == "demo-upstream":
            argv, fix = ["serve", "--port", str(free_port())], "LLM_PROXY_DEMO_UPSTREAM_PORT"
            env["LLM_PROXY_DEMO_UPSTREAM_PORT"] = str(port)
        else:
            argv, fix = ["fake-upstream", "--port", str(port)], "--port"
        lines = _failed_start(argv, env)
    assert len(lines) == 1, lines
    assert "already in use" in lines[0] and fix in lines[0]
    assert not any("Traceback" in line for line in lines)


@pytest.mark.parametrize(
    ("argv", "env", "says"),
    [
        (["serve"], {"LLM_PROXY_PORT": "eighty"}, "LLM_PROXY_PORT='eighty' is not a whole number"),
        (["serve"], {"LLM_PROXY_WORKERS": "two"}, "LLM_PROXY_WORKERS='two' is not a whole number"),
        (["serve"], {"LLM_PROXY_DEMO_UPSTREAM_PORT": "x"}, "LLM_PROXY_DEMO_UPSTREAM_PORT='x'"),
        (["serve", "--port", "99999"], {}, "(a port is 0-65535); pass --port N or set"),
        (["serve", "--host", "no-such-host.invalid"], {}, "pass --host ADDRESS or set"),
        (["serve", "--workers", "0"], {}, "pass --workers N or set LLM_PROXY_WORKERS=N"),
        (["serve", "--workers", "2"], {}, "the embedded demo runs one worker"),
        (["serve", "--ssl-certfile", "/no/such/cert.pem"], {}, "cannot read --ssl-certfile"),
        (["serve", "--ssl-keyfile", str(ROOT / "LICENSE")], {}, "needs --ssl-certfile"),
        (["serve", "--ssl-certfile", str(ROOT / "LICENSE")], {}, "not a PEM certificate"),
        (["serve"], {"LLM_PROXY_LOG_LEVEL": "loud"}, "unknown log level 'loud'"),
        (["fake-upstream", "--port", "70000"], {}, "port must be in 0..65535"),
        (["fake-upstream", "--host", "no-such-host.invalid"], {}, "pass --host ADDRESS"),
    ],
)
def test_a_start_up_mistake_is_one_line_saying_what_to_change(
    argv: list[str],
    env: dict[str, str],
    says: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Whatever stops the start (a variable that is not a number, a port out of range, an
    address that is not this machine's, unusable TLS files...): one line, exit 1. Run in
    this process (``main``, as ``python -m proxy`` calls it): that the process prints
    those lines alone and exits 1 is shown by the tests around this one, in processes."""
    for name in os.environ:
        if name.startswith("LLM_PROXY_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("LLM_PROXY_DEMO_UPSTREAM_PORT", str(free_port()))
    for name, value in env.items():
        monkeypatch.setenv(name, value)

    def started(*_: object) -> int:
        raise AssertionError(f"{argv} started")  # a check let it through

    monkeypatch.setattr("proxy.process.cli._serve_demo", started)
    monkeypatch.setattr("proxy.fake_upstream.cli.serve", started)
    try:
        code = main(argv)
    except SystemExit as exit_:  # the fake upstream's own CLI exits
        code = exit_.code
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 1, lines
    assert len(lines) == 1, lines
    assert says in lines[0]


@pytest.mark.slow
def test_every_start_up_problem_is_its_own_line() -> None:
    """Two busy ports and two bad variables: four lines, not only the first."""
    with _listening() as proxy_port, _listening() as upstream_port:
        environment = _without_proxy_variables()
        environment["LLM_PROXY_DEMO_UPSTREAM_PORT"] = str(upstream_port.getsockname()[1])
        environment["LLM_PROXY_LOG_LEVEL"] = "loud"
        environment["LLM_PROXY_WORKERS"] = "two"
        lines = _failed_start(["serve", "--port", str(proxy_port.getsockname()[1])], environment)
    assert len(lines) == 4, lines
    assert all(line.startswith("llm-proxy: ") for line in lines)
    assert "LLM_PROXY_WORKERS='two' is not a whole number" in lines[0]
    assert "already in use" in lines[1] and "LLM_PROXY_PORT=N" in lines[1]
    assert "already in use" in lines[2] and "LLM_PROXY_DEMO_UPSTREAM_PORT=N" in lines[2]
    assert "unknown log level 'loud'" in lines[3]


@pytest.mark.slow
def test_two_variables_that_are_not_numbers_are_two_lines() -> None:
    environment = _without_proxy_variables()
    environment.update(LLM_PROXY_PORT="eighty", LLM_PROXY_DEMO_UPSTREAM_PORT="x")
    lines = _failed_start(["serve"], environment)
    assert len(lines) == 2, lines
    assert "LLM_PROXY_PORT='eighty'" in lines[0] and "LLM_PROXY_DEMO_UPSTREAM_PORT='x'" in lines[1]


@pytest.mark.slow
def test_serve_help_describes_every_option_and_variable() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "proxy", "serve", "--help"], capture_output=True, text=True
    )
    for option in ("--config", "--host", "--port", "--workers", "--ssl-certfile", "--ssl-keyfile"):
        assert option in result.stdout
    for variable in (
        "LLM_PROXY_HOST",
        "LLM_PROXY_PORT",
        "LLM_PROXY_WORKERS",
        "LLM_PROXY_SSL_CERTFILE",
        "LLM_PROXY_SSL_KEYFILE",
        "LLM_PROXY_DEMO_UPSTREAM_PORT",
        "LLM_PROXY_LOG_LEVEL",
    ):
        assert variable in result.stdout


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl is not installed")
def test_serve_speaks_tls_with_the_given_certificate(tmp_path: Path) -> None:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
         "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    port = free_port()
    env = {**os.environ, "LLM_PROXY_DEMO_UPSTREAM_PORT": str(free_port())}
    demo = subprocess.Popen(
        [sys.executable, "-m", "proxy", "serve", "--port", str(port),
         "--ssl-certfile", str(cert), "--ssl-keyfile", str(key)],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    try:
        url = f"https://127.0.0.1:{port}/health/live"
        trusted = ssl.create_default_context(cafile=str(cert))
        wait_until(lambda: _answers(url, trusted), timeout=30, what="TLS proxy up")
        assert httpx.get(url, verify=trusted, timeout=5).status_code == 200
    finally:
        os.killpg(demo.pid, signal.SIGTERM)
        demo.wait(timeout=15)


def _answers(url: str, trusted: ssl.SSLContext) -> bool:
    try:
        return httpx.get(url, verify=trusted, timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.mark.slow
def test_the_readmes_demo_config_command_serves(tmp_path: Path) -> None:
    """`llm-proxy fake-upstream --port 8001 ... &` then `serve --config config/demo.yaml ...`
    (ports moved to free ones through the config's own variable), with the demo's key."""
    upstream_port, port = free_port(), free_port()
    env = {**os.environ, "FAKE_UPSTREAM_URL": f"http://127.0.0.1:{upstream_port}"}
    upstream = subprocess.Popen(
        [sys.executable, "-m", "proxy", "fake-upstream", "--port", str(upstream_port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    proxy = subprocess.Popen(
        [sys.executable, "-m", "proxy", "serve", "--config", str(ROOT / "config/demo.yaml"),
         "--port", str(port), "--workers", "2"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    try:
        wait_ready(f"http://127.0.0.1:{port}/health/ready", proxy)
        body = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]}
        answer = httpx.post(
            f"http://127.0.0.1:{port}/v1/chat/completions",
            json=body,
            headers={"authorization": "Bearer demo-key"},
            timeout=10,
        )
        assert answer.status_code == 200, answer.text
    finally:
        for process in (proxy, upstream):
            os.killpg(process.pid, signal.SIGTERM)
            process.wait(timeout=15)


# The parent of several workers does not serve: it starts them. What it imports on the
# way delays every worker (they are spawned after it), so it must not import the app.
PARENT_IMPORTS = """
import sys
import proxy.process.supervisor

def started(config):
    names = ("proxy.process.app", "proxy.pipeline.pipeline", "fastapi")
    loaded = [name for name in names if name in sys.modules]
    print(" ".join(loaded) or "nothing", config.http)

proxy.process.supervisor.run_supervised = started
from proxy.process.cli import main
sys.exit(main(["serve", "--config", sys.argv[1], "--workers", "2", "--port", "0"]))
"""


@pytest.mark.slow
def test_the_parent_of_several_workers_starts_them_without_importing_the_app(
    tmp_path: Path,
) -> None:
    config = tmp_path / "proxy.yaml"
    config.write_text(
        "models:\n  - name: m\n    deployments:\n"
        "      - {id: d, base_url: 'http://127.0.0.1:9/v1', api_key: sk-x}\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", PARENT_IMPORTS, str(config)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip

    assert done.returncode == 0, done.stderr
    loaded, protocol = done.stdout.split()
    assert loaded == "nothing"
    # ...and names the HTTP protocol each worker imports and serves with.
    from uvicorn.importer import import_from_string

    from proxy.api.direct import DirectReplyProtocol

    assert import_from_string(protocol) is DirectReplyProtocol
