"""Prices as data plus pure functions over them. `pricing.egress`: moving checkpoint bytes."""
