"""The read views, now in broker.wire (the API's data types, shared with the HTTP client):
re-exported here for the server-side modules that import them from this old place."""

from broker.wire import (
    AttemptInfo,
    EventInfo,
    JobInfo,
    JoinTokenInfo,
    LogChunk,
    LostWorkRow,
    NodeInfo,
    PoolInfo,
    TokenInfo,
    fmt_usd,
)

__all__ = ["AttemptInfo", "EventInfo", "JobInfo", "JoinTokenInfo", "LogChunk", "LostWorkRow", "NodeInfo",
           "PoolInfo", "TokenInfo", "fmt_usd"]
