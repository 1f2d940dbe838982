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
    "app.commands.sim",
    "app.run",
    "app.commands.lake",
    "app.commands.autoplex",
    "app.commands.abtest",
    "app.commands.emulate",
    "app.commands.distill",
    "app.commands.export",
    "app.commands.models",
    "app.commands.registry",
    "app.commands.contract",
    "app.commands.relocate",
    "app.commands.cluster",
    "app.commands.fleet",
    "app.commands.maintain",
)


def _register_all() -> None:
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(app)


_register_all()

if __name__ == "__main__":
    app()
