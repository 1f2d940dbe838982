"""`ccs contract`: the data contract's field reference (ccselect/contract.py), as Markdown for
docs/contract.md or as JSON."""
from __future__ import annotations

import json
import os

import typer

from ccselect import contract
from ccselect.config import project_root

DOC_PATH = os.path.join("docs", "contract.md")


def register(app: typer.Typer) -> None:
    app.command("contract")(contract_cmd)


def contract_cmd(
    markdown: bool = typer.Option(False, "--markdown", help="write the Markdown field reference (docs/contract.md)"),
    out: str = typer.Option("", "--out", help="where --markdown writes (default <project>/docs/contract.md; - for stdout)"),
) -> None:
    """The data contract's fields: type, unit, range, meaning, how to fill them (JSON, or --markdown)."""
    if not markdown:
        typer.echo(json.dumps({stream: {name: {"type": typ.__name__, "unit": contract.FIELD_DOCS[stream][name][0],
                                               "range": contract.RANGES.get(name) if stream == "transport" else None,
                                               "nullable": name in contract.NULLABLE.get(stream, set()),
                                               "meaning": contract.FIELD_DOCS[stream][name][1],
                                               "source": contract.FIELD_DOCS[stream][name][2]}
                                        for name, typ in fields.items()}
                               for stream, fields in contract.FIELDS.items()}, indent=2))
        return
    text = contract.render_markdown()
    if out == "-":
        typer.echo(text, nl=False)
        return
    path = out or os.path.join(str(project_root()), DOC_PATH)
    with open(path, "w") as f:
        f.write(text)
    typer.echo(f"wrote {path}")
