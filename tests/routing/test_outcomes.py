"""What an answer that no OpenAI-compatible API would send means: a redirect or a 4xx
whose body is not a JSON object. It cools the deployment (no LLM API answers there: a
base_url missing its /v1) and reaches the client as the contract's 502 naming the
deployment and URL, unless its status is about the client's request (413 from a web
server in front): then that status, in the contract's shape."""

from __future__ import annotations

import pytest

from proxy.errors import InvalidRequest, UpstreamError
from proxy.upstream.outcomes import SUCCESS, unshaped, unshaped_error


@pytest.mark.parametrize("status", [200, 201])
def test_successes_are_never_unshaped(status: int) -> None:
    assert unshaped(status, b"<html>", 30.0) is None


@pytest.mark.parametrize("status", [301, 400, 404, 405, 413, 422])
def test_errors_that_are_json_objects_are_passed_on(status: int) -> None:
    assert unshaped(status, b'{"error": {"message": "no"}}', 30.0) is None


@pytest.mark.parametrize("body", [b"404 page not found", b"<html></html>", b"", b'"a string"'])
@pytest.mark.parametrize("status", [301, 404, 405, 418])
def test_other_unshaped_answers_cool_the_deployment(status: int, body: bytes) -> None:
    outcome = unshaped(status, body, 30.0)
    assert outcome is not None and outcome.kind == "failure"
    assert outcome.reason == "misconfigured" and outcome.cool_for == 30.0
    error = unshaped_error(status, "d", "http://127.0.0.1:9/chat/completions")
    assert isinstance(error, UpstreamError) and error.status == 502
    assert error.code == "upstream_error"
    assert "'d'" in error.message and "http://127.0.0.1:9/chat/completions" in error.message


@pytest.mark.parametrize("status", [400, 409, 413, 414, 415, 422])
def test_unshaped_answers_about_the_request_keep_their_status(status: int) -> None:
    assert unshaped(status, b"<html>Request Entity Too Large</html>", 30.0) is SUCCESS
    error = unshaped_error(status, "d", "http://u/chat/completions")
    assert isinstance(error, InvalidRequest) and error.status == status
    assert error.type == "invalid_request_error"


@pytest.mark.parametrize("status", [404, 405])
def test_a_web_frameworks_own_404_is_no_llm_apis_answer(status: int) -> None:
    """FastAPI's answer for a path it does not serve: vLLM's base_url without /v1."""
    outcome = unshaped(status, b'{"detail":"Not Found"}', 30.0)
    assert outcome is not None and outcome.reason == "misconfigured"
    assert unshaped(422, b'{"detail": [{"loc": ["body"]}]}', 30.0) is None  # a real 422
