"""The Streamlit dashboard (`onepool dashboard`). It reads only through query functions: on the
database (dashboard.data) or over the API as a token's principal (dashboard.remote)."""
