"""The node agent (`onepool agent`): joins the server with a one-time token, heartbeats,
long-polls for the ranks placed on its node, runs each under the same supervisor as local
ranks (providers.local), relays signals, ships output, reports exits and cloud interruption
notices. It needs nothing but its outgoing connection to the server."""
