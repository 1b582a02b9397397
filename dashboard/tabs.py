"""The dashboard's tabs, in the order it shows them, and links into them (importable without
running the app: dashboard/app.py is a Streamlit script that runs when imported).

The open tab and the job shown on the Jobs tab are query parameters, so a link opens them:
`?tab=Jobs&job=12`. (The tab's label is the parameter's value: renaming a tab breaks links.)"""

from __future__ import annotations

from urllib.parse import urlencode

TABS = ["Overview", "Cost per experiment", "Jobs", "Preemptions", "Nodes & pools", "Budgets", "Rebalancing",
        "Replay"]
LOOPBACK = ("127.0.0.1", "localhost", "::1")  # addresses only this machine reaches
TAB_KEY, JOB_KEY = "tab", "job"  # the query parameters (and Streamlit widget keys) of the tab and job


def link(tab: str, job: int | None = None) -> str:
    """A link (relative to the dashboard's page) that opens `tab`, and on the Jobs tab `job`.
    Raises ValueError naming the tabs for another tab, or for a job with a tab other than Jobs."""
    if tab not in TABS:
        raise ValueError(f"tab: must be one of {', '.join(TABS)} (got {tab!r})")
    if job is not None and tab != "Jobs":
        raise ValueError(f"job: only the Jobs tab shows one job (got tab {tab!r})")
    return "?" + urlencode({TAB_KEY: tab, **({JOB_KEY: int(job)} if job is not None else {})})


def job_link(job: int) -> str:
    """The link that opens `job` on the Jobs tab: `?tab=Jobs&job=12`."""
    return link("Jobs", job)


def wanted_job(params: dict[str, str], key: str = JOB_KEY) -> int | None:
    """The job a link asks for (`job=12`), None when it names none or not a job id."""
    v = params.get(key, "")
    return int(v) if v.isdigit() and 0 < int(v) < 2**63 else None
