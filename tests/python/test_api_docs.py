"""The public API says what it takes: numpydoc sections naming every parameter, and the
request methods typed by their ``wait`` (overloads), so a type checker knows that
``pull()`` returns arrays and ``pull(wait=False)`` a Request."""
import inspect
import re
import typing

import pytest

import tessera
import tessera.keras as tk

DOCUMENTED = [
    tessera.Client, tessera.Client.declare, tessera.Client.assign, tessera.Client.pull,
    tessera.Client.push, tessera.Client.push_pull, tessera.load_job, tk.Optimizer,
    tk.optimizer, tk.ProgressCallback,
]


def _section(doc: str, title: str) -> str:
    """The text of numpydoc section `title` (up to the next section), or ''."""
    m = re.search(rf"^\s*{title}\n\s*-{{{len(title)}}}\n(.*?)(?=^\s*\w[\w ]*\n\s*-{{3,}}\n|\Z)",
                  doc, re.S | re.M)
    return m.group(1) if m else ""


@pytest.mark.parametrize("obj", DOCUMENTED, ids=lambda o: o.__qualname__)
def test_numpydoc_parameters(obj):
    doc = inspect.getdoc(obj) or ""
    params = _section(doc, "Parameters")
    assert params, f"{obj.__qualname__}: no Parameters section"
    target = obj.__init__ if inspect.isclass(obj) else obj
    for name, p in inspect.signature(target).parameters.items():
        if name == "self":
            continue
        shown = "**" + name if p.kind is p.VAR_KEYWORD else name
        assert re.search(rf"(^|[ ,]){re.escape(shown)}\b", params, re.M), \
            f"{obj.__qualname__}: parameter {shown!r} is not described"


@pytest.mark.parametrize("fn", [tessera.Client.declare, tessera.Client.assign,
                                tessera.Client.pull, tessera.Client.push,
                                tessera.Client.push_pull, tessera.load_job, tk.optimizer],
                         ids=lambda o: o.__qualname__)
def test_numpydoc_returns(fn):
    assert _section(inspect.getdoc(fn) or "", "Returns"), f"{fn.__qualname__}: no Returns"


@pytest.mark.parametrize("name,count", [("pull", 3), ("push", 2), ("push_pull", 2)])
def test_request_methods_overloaded_on_wait(name, count):
    overloads = typing.get_overloads(getattr(tessera.Client, name))
    assert len(overloads) == count
    waits = {str(inspect.signature(o).parameters["wait"].annotation) for o in overloads}
    assert any("False" in w for w in waits) and any("True" in w for w in waits)
