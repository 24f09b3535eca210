"""Developer tools of the collection (not shipped to target hosts)."""
