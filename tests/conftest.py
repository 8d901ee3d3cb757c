import os

# vLLM's Triton kernels run on a CPU under Triton's interpreter, which must be
# chosen before Triton is imported; an empty CUDA_VISIBLE_DEVICES keeps vLLM's
# Triton probe from disabling Triton.  The GPU stage (KVSPEC_DEVICE=cuda) runs
# them compiled.
if os.environ.get("KVSPEC_DEVICE", "cpu") == "cpu":
    os.environ.setdefault("TRITON_INTERPRET", "1")
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

# Under pytest-xdist every worker is one process per core: torch's own thread
# pool on top would oversubscribe the cores (the kernel stage's small tensors
# then run several times slower).
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")

from kvspec.conformance.settings import load_profile
from operations import OPERATIONS

load_profile()


def pytest_runtest_logreport(report):
    for key, value in report.user_properties:
        if key == "kvspec-operations":
            OPERATIONS[value[0]] = value[1]


def pytest_terminal_summary(terminalreporter):
    if OPERATIONS:
        terminalreporter.section("conformance operations")
        for name, count in sorted(OPERATIONS.items()):
            terminalreporter.write_line(f"{name:<40} {count:>8}")
        terminalreporter.write_line(f"{'total':<40} {sum(OPERATIONS.values()):>8}")
