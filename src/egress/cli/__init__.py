"""The command line interface (typer + rich)."""
