"""`ccs`, the command line of ccselect. Each area registers its own commands from its own
module (`register(app)`), so the CLI file only wires; heavy imports stay inside commands."""
from __future__ import annotations

import importlib

import typer

app = typer.Typer(
    name="ccs",
    help="ccselect: learn per-prefix TCP congestion control for CDN edges and enforce it.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

#: Modules that contribute commands; each defines `register(app: typer.Typer) -> None`.
COMMAND_MODULES = (
    "ccselect.app.commands.sim",
    "ccselect.app.run",
    "ccselect.app.commands.lake",
    "ccselect.app.commands.autoplex",
    "ccselect.app.commands.abtest",
    "ccselect.app.commands.emulate",
    "ccselect.app.commands.distill",
    "ccselect.app.commands.export",
    "ccselect.app.commands.models",
    "ccselect.app.commands.registry",
    "ccselect.app.commands.contract",
    "ccselect.app.commands.relocate",
    "ccselect.app.commands.cluster",
    "ccselect.app.commands.fleet",
    "ccselect.app.commands.maintain",
)


def _register_all() -> None:
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(app)


_register_all()

if __name__ == "__main__":
    app()
