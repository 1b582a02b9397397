"""Persistent state: tables, the store and its migrations, events, read views, costs, the ledger."""
