"""Operations run per (machine, layout), recorded by the lockstep tests and
printed by conftest at the end of a run, so a CI log shows how much was checked."""

OPERATIONS: dict[str, int] = {}
