"""Composers turn op tuples into candidate tasks: `template` (offline) and `llm`."""
