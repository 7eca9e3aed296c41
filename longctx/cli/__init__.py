"""The `longctx` command line: a thin layer of typer sub-apps over the library."""
