"""The HTTP API (FastAPI): the SDK's operations under /v1 with per-team tokens, and the node
agents' protocol under /v1/agent. `create_app` builds it; `onepool server` serves it."""
