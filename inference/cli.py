"""``ttsfleet serve`` and ``ttsfleet bench serve``."""

import typer


def register(root: typer.Typer) -> None:
    """Add this component's commands to the root CLI."""
