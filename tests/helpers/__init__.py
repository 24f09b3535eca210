"""Builders shared by the tests: GGUF layouts, llama-server runs, role deploys, the test fleet, report samples."""
