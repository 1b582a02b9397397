"""onepool broker: one priority queue over every GPU a group can reach."""

__version__ = "0.1.0"
