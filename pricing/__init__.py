"""Prices as data and pure cost functions: `pricing.cost` (effective price of capacity),
`pricing.egress` (moving checkpoint bytes)."""
