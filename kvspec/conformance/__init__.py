"""Conformance machinery: target adapters and state machines that check any
block-pool implementation against the specification."""
