"""Prices as data and pure cost functions."""
