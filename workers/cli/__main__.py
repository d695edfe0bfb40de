"""`python -m workers.cli`: the `sco` command, as the box starts its own processes."""

from workers.cli.entry import main

main()
