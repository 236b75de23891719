"""A request's ``Call`` is the values its stages made, not a bag every stage writes.

Each attribute of ``Call`` is assigned (``call.X = ...``, ``call.X.Y = ...``, ``+=``, in
a tuple) only in the modules of the stage that makes it: ``WRITERS`` says which, as data,
so an attribute cannot be added without naming its writer. The stages' values are
immutable: ``@value`` (mypy rejects any assignment to their fields), and a step makes a
new one. Read with ``ast``; nothing of the package is run but ``Call``'s definition.
"""

from __future__ import annotations

import ast
import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest

from proxy.costs import INPUT_TOKENS, TOKENS
from proxy.limiter.base import Clamp
from proxy.request import call as call_module
from proxy.request.call import Admission, Arrival, Ask, Call, Caller, Pin
from proxy.shapes.chat import CHAT

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "proxy"

PIPELINE = "proxy/pipeline/pipeline.py"
FOLLOW_UPS = "proxy/pipeline/follow_ups.py"

# Call's attribute -> the modules that may assign it (or a field of it).
WRITERS: dict[str, frozenset[str]] = {
    # The stages' values, each made by one stage (follow_ups.py and budgets.py return a
    # new Ask or Admission; the pipeline puts it on the call).
    "arrival": frozenset({PIPELINE}),  # Pipeline.handle: the request as read
    "caller": frozenset({PIPELINE}),  # Pipeline._identify: the client key
    "ask": frozenset({PIPELINE}),  # Pipeline._read: the parsed request
    "admission": frozenset({PIPELINE}),  # the key's check and its budgets' reservation
    "pin": frozenset({FOLLOW_UPS}),  # a follow-up's deployment
    # The run-time state of its journey, one writer each.
    "trip": frozenset({"proxy/routing/dispatcher.py"}),
    "error_code": frozenset({PIPELINE}),
    "created": frozenset({FOLLOW_UPS}),
    "retrieved": frozenset({FOLLOW_UPS}),
    "trace": frozenset({"proxy/observability/tracing.py"}),
    "translations": frozenset({"proxy/upstream/exchange.py"}),
}

VALUES = (Arrival, Caller, Ask, Admission, Pin)


def _targets(node: ast.AST) -> Iterator[ast.expr]:
    """The expressions ``node`` assigns to, tuples and starred ones unpacked."""
    if isinstance(node, ast.Assign):
        pending = list(node.targets)
    elif isinstance(node, ast.AugAssign | ast.AnnAssign):
        pending = [node.target]
    else:
        return
    while pending:
        target = pending.pop()
        if isinstance(target, ast.Tuple | ast.List):
            pending.extend(target.elts)
        elif isinstance(target, ast.Starred):
            pending.append(target.value)
        else:
            yield target


def _call_attribute(target: ast.expr) -> str | None:
    """X, when ``target`` is ``<a call>.X``, ``<a call>.X.Y...`` or an item in one (a
    call: a name or an attribute called ``call`` or ``*_call``, as ``self._call``)."""
    chain = []
    while isinstance(target, ast.Attribute | ast.Subscript):  # call.ask.body[k] too
        if isinstance(target, ast.Attribute):
            chain.append(target.attr)
        target = target.value
    if isinstance(target, ast.Name):
        chain.append(target.id)
    names = chain[::-1]
    for i, name in enumerate(names[:-1]):
        if name == "call" or name.endswith("_call"):
            return names[i + 1]
    return None


def _made(tree: ast.Module) -> Iterator[str]:
    """The attributes a module sets by making a ``Call`` (proxy.request.call's): its
    arrival, and each one given by name."""
    imports = any(
        isinstance(n, ast.ImportFrom)
        and n.module == "proxy.request.call"
        and any(alias.name == "Call" for alias in n.names)
        for n in ast.walk(tree)
    )
    if not imports:
        return
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "Call"
        ):
            yield "arrival"
            yield from (k.arg for k in node.keywords if k.arg is not None)


def _writes() -> dict[str, set[str]]:
    """Call's attributes -> the modules of ``proxy/`` that assign them (or make a call
    with them)."""
    fields = {f.name for f in dataclasses.fields(Call)}
    found: dict[str, set[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        module = path.relative_to(ROOT).as_posix()
        tree = ast.parse(path.read_text(), str(path))
        names = [_call_attribute(t) for node in ast.walk(tree) for t in _targets(node)]
        for name in [*names, *_made(tree)]:
            if name in fields:
                found.setdefault(name, set()).add(module)
    return found


def test_every_attribute_of_a_call_names_its_writers() -> None:
    assert {f.name for f in dataclasses.fields(Call)} == set(WRITERS)


def test_each_attribute_of_a_call_is_assigned_by_its_stage_only() -> None:
    strays = {
        name: sorted(modules - WRITERS[name])
        for name, modules in _writes().items()
        if modules - WRITERS[name]
    }
    assert strays == {}, "assigned outside its stage (WRITERS)"


def test_the_reading_of_writes_finds_them() -> None:
    """The check above sees every form of assignment (it would pass seeing none)."""
    source = (
        "call.ask = a\ncall.ask.body = b\nself._call.pin = c\ncall.trip.retries += 1\n"
        "call.caller, call.admission = d\nrequest.ask = e\ncall.ask.body['k'] = f\n"
    )
    seen = [_call_attribute(t) for node in ast.walk(ast.parse(source)) for t in _targets(node)]
    assert sorted(filter(None, seen)) == ["admission", "ask", "ask", "ask", "caller", "pin", "trip"]
    assert set(_writes()) >= {"arrival", "ask", "admission", "pin", "trip", "error_code"}


def _class(name: str) -> ast.ClassDef:
    """Its definition in proxy/request/call.py."""
    tree = ast.parse(Path(call_module.__file__).read_text())
    return next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name)


@pytest.mark.parametrize("value", VALUES, ids=lambda v: v.__name__)
def test_the_stages_values_are_immutable(value: type) -> None:
    """``@value``: frozen to mypy (any assignment to a field fails ``make lint``), a plain
    slots dataclass at run time (a frozen one's ``__init__`` costs the request path)."""
    node = _class(value.__name__)
    assert [ast.unparse(d) for d in node.decorator_list] == ["value"]
    assert dataclasses.is_dataclass(value) and hasattr(value, "__slots__")
    assigned = [
        ast.unparse(t)
        for n in ast.walk(node)
        for t in _targets(n)
        if isinstance(t, ast.Attribute) and ast.unparse(t.value) == "self"
    ]
    assert assigned == []  # no method changes one: each makes a new one


def test_a_step_makes_a_new_value_and_leaves_the_old_one() -> None:
    clamp = Clamp({TOKENS: 10.0}, {TOKENS: 1.0}, 100, 1)
    admission = Admission(reserved={TOKENS: 110.0}, clamp=clamp)
    lowered = admission.lowered(Clamp({TOKENS: 10.0}, {TOKENS: 1.0}, 50, 1))
    assert lowered.clamped and lowered.clamp is not None and lowered.clamp.most == 50
    assert not admission.clamped and admission.clamp is clamp
    assert admission.shadow_refused("rate_limited").shadow_rejection == "rate_limited"
    assert admission.shadow_rejection is None

    body = {"model": "m", "max_tokens": 500}
    ask = Ask("m", body=body, raw=b'{"model":"m","max_tokens":500}', cost={INPUT_TOKENS: 3.0})
    sent = ask.sent_with({"max_tokens": 120})
    assert sent.body == {"model": "m", "max_tokens": 120} and sent.raw.endswith(b"120}")
    assert ask.body is body and body["max_tokens"] == 500  # the old ask's body untouched
    assert (sent.model, sent.cost, sent.input_estimate) == ("m", {INPUT_TOKENS: 3.0}, 3)


def test_a_new_call_holds_the_values_before_any_stage() -> None:
    call = Call(Arrival("r", CHAT, 0.0))
    assert call.caller.key_name is None and call.caller.max_wait == 0.0
    assert call.ask.model == "unknown" and call.pin.deployment is None
    assert call.admission.verdict is None and not call.admission.reserved
