"""The leader's cycle and its hands: engine, capacity, budgets, retention, snapshots, config."""
