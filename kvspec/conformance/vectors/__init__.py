"""Language-neutral test vectors: JSON files of operations and the
snapshots the spec says must follow them.

``codec`` reads, writes and checks a vector against any target; ``corpus``
generates the published corpus (hand-written cases plus the machines' walks)
and its index of the rules each vector exercises; ``content_view`` the cases
of chapter 10's rules over an engine's content view, with the spec's verdicts;
``offload`` the ``offload`` scope, an offloading tier's vectors (chapter 11):
their state, the spec's tier recording them, their replay judged by the tier
rules, and the hand-written cases; ``steps`` what they share (a vector's
steps with the state before and after each, a case's demand for a refusal).
"""
