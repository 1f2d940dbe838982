"""docs/contract.md is what `ccs contract --markdown` renders from ccselect/contract.py now, and
every field of the contract is documented."""
from __future__ import annotations

from ccs_testing import REPO
from ccselect import contract


def test_every_field_has_docs():
    assert set(contract.FIELD_DOCS) == set(contract.FIELDS)
    for stream, fields in contract.FIELDS.items():
        assert set(contract.FIELD_DOCS[stream]) == set(fields), stream
        for name, doc in contract.FIELD_DOCS[stream].items():
            assert len(doc) == 3 and all(isinstance(x, str) and x.strip() for x in doc), (stream, name)


def test_committed_doc_is_current(tmp_path):
    from typer.testing import CliRunner

    from ccselect.app.cli import app
    out = tmp_path / "contract.md"
    res = CliRunner().invoke(app, ["contract", "--markdown", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert out.read_text() == contract.render_markdown()
    assert (REPO / "docs" / "contract.md").read_text() == out.read_text(), \
        "docs/contract.md is stale: run `ccs contract --markdown`"
    for fields in contract.FIELDS.values():
        for name in fields:
            assert f"| `{name}` |" in out.read_text()
