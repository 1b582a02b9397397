"""The Streamlit dashboard (`onepool dashboard`). It reads only through broker query functions."""
