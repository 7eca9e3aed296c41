"""One table style for every report the CLI prints, sized for a 100-column terminal.

Rich's default box spends three columns of rules and padding per column; with eight or more columns
that alone pushes a report past 100 columns, where the terminal folds each row into noise. Light rules
and single spaces between columns cost one column each; detail that still does not fit goes to
`--json` and the plots, never into a wider table.
"""

from __future__ import annotations

from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table

TERMINAL_COLUMNS = 100


def narrow_table(title: str | None = None, **kwargs: Any) -> Table:
    return Table(
        title=title,
        box=box.SIMPLE_HEAD,
        padding=(0, 1),
        collapse_padding=True,
        pad_edge=False,
        title_justify="left",
        **kwargs,
    )


def natural_width(table: Table) -> int:
    """The width the table takes when nothing forces it narrower (what a test compares with 100)."""
    return Console(width=10_000).measure(table).maximum
