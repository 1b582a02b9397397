"""The dashboard's tabs, in the order it shows them (importable without running the app:
dashboard/app.py is a Streamlit script that runs when imported)."""

TABS = ["Overview", "Cost per experiment", "Job", "Preemptions", "Nodes & pools", "Budgets", "Rebalancing"]
