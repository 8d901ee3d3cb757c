"""Operations run per (machine, layout), recorded by the lockstep tests and
printed by conftest at the end of a run, so a CI log shows how much was checked."""

OPERATIONS: dict[str, int] = {}  # filled in the controlling process, from the test reports


def record(request, name: str, count: int) -> None:
    """Report ``count`` operations for ``name`` from inside a test (``request``
    is pytest's fixture); the report reaches the controlling process under
    pytest-xdist too."""
    request.node.user_properties.append(("kvspec-operations", (name, count)))
