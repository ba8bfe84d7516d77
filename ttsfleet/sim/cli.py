"""``ttsfleet simulate``."""

import typer


def register(root: typer.Typer) -> None:
    @root.command()
    def simulate() -> None:
        """Simulate the fleet policy on the embedded default trace."""
        raise typer.Exit(0)
