from kvspec.conformance.settings import load_profile
from operations import OPERATIONS

load_profile()


def pytest_terminal_summary(terminalreporter):
    if OPERATIONS:
        terminalreporter.section("conformance operations")
        for name, count in sorted(OPERATIONS.items()):
            terminalreporter.write_line(f"{name:<40} {count:>8}")
        terminalreporter.write_line(f"{'total':<40} {sum(OPERATIONS.values()):>8}")
