"""The operator console (`sco console`): read-only, server-rendered pages of the estate."""
