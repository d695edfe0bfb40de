"""`python -m agent`: the node agent."""

from agent.cli import main

raise SystemExit(main())
