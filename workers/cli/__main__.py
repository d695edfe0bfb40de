"""`python -m workers.cli`: the `sco` command, as the box starts its own processes."""

from workers.cli.main import main

main()
