"""OpenBao: the HTTP client, the plan SCO lays over a server, and provisioning."""
