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
    tk.optimizer, tk.ProgressCallback, tessera.Table, tessera.Client.pull_rows,
    tessera.Client.push_rows, tessera.Client.push_pull_rows, tk.Embedding,
    tessera.load_weights, tessera.read_weights,
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
                                tessera.Client.push_pull, tessera.load_job, tk.optimizer,
                                tessera.Client.pull_rows, tessera.Client.push_rows,
                                tessera.Client.push_pull_rows, tessera.load_weights,
                                tessera.read_weights],
                         ids=lambda o: o.__qualname__)
def test_numpydoc_returns(fn):
    assert _section(inspect.getdoc(fn) or "", "Returns"), f"{fn.__qualname__}: no Returns"


@pytest.mark.parametrize("name,count", [("pull", 3), ("push", 2), ("push_pull", 2)])
def test_request_methods_overloaded_on_wait(name, count):
    overloads = typing.get_overloads(getattr(tessera.Client, name))
    assert len(overloads) == count
    waits = {str(inspect.signature(o).parameters["wait"].annotation) for o in overloads}
    assert any("False" in w for w in waits) and any("True" in w for w in waits)


def test_job_holds_every_key_of_the_table(tmp_path):
    """The Job's fields come from the C key table (tessera/_job_keys.py is generated from
    it): every key of a job file is there, typed, under its field name."""
    from tessera._job_keys import KEYS
    cfg = tmp_path / "job.cfg"
    cfg.write_text('train = { batch_size = 32; };\noptimizer = { name = "adam"; };\n'
                   'cluster = { ps = ["127.0.0.1:7100", "127.0.0.1:7101"]; };\n')
    job = tessera.load_job(cfg, ["job.mode=async"], use_env=False)
    assert len(KEYS) > 60
    for key, name in KEYS.items():
        assert job.value(key) == getattr(job, name)
    assert job.value("train.batch_size") == job.batch_size == 32
    assert job.optimizer == "adam" and job.mode == "async"
    assert job.ps == ["127.0.0.1:7100", "127.0.0.1:7101"]
    assert isinstance(job.checkpoint_interval_s, float) and isinstance(job.layers, list)
    with pytest.raises(KeyError, match="not a key"):
        job.value("train.batchsize")
