"""A vLLM release's own block-manager unit tests, run against vLLM and
against kvspec's drop-in (the way PyPy runs CPython's test suite).

The test files come from the release's source distribution on PyPI,
unmodified: the archive's SHA-256 and every file's are checked against the
values recorded here (:data:`SUITES`) before anything runs.  They are
extracted into a scratch directory next to a conftest of kvspec's, which --
when ``KVSPEC_DROPIN=1`` -- installs the drop-in (``kvspec.dropin``) before
any test module imports vLLM's block manager.  The suite runs twice, plain
and with the drop-in, and the table says for every test: passed on vLLM,
passed on kvspec, and for each that passes on vLLM but not on kvspec the
written reason (``tools/peer_suite_differences.json``, by release, each a
deliberate difference named in docs/rules.md).  A release other than the
running interpreter's vLLM is installed alone under kvspec's cache and put
first on the path (about 750 MB a release).

    .venv-vllm/bin/python tools/peer_suite.py                  # 0.25.1: download (cached), run both, print
    .venv-vllm/bin/python tools/peer_suite.py --release 0.26.0 --markdown table.md

Exit 0 when every test that passes on vLLM passes on kvspec or is a listed
difference (and every listed difference still fails); 1 otherwise; 2 when
the release is not one with a suite here, or the files cannot be had or do
not match their checksums.  Tests that need the Hugging Face hub or an
accelerator (engine configuration, not the block manager) fail on vLLM too
offline, and are reported as such.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import urllib.request
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import NamedTuple

from kvspec.spec.releases import BASE

ROOT = Path(__file__).resolve().parent.parent
DIFFERENCES = ROOT / "tools" / "peer_suite_differences.json"


class Suite(NamedTuple):
    """One release's block-manager tests: its archive's SHA-256 as PyPI
    publishes it, and every file taken from it with its own."""

    sdist_sha256: str
    files: dict[str, str]


_EMPTY = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"  # an empty __init__.py
SUITES: dict[str, Suite] = {
    BASE: Suite("ddbdec3f1c0f21afa70b7eb6ddf3faa29d26b1302ee4b5d5e00ec3af41b0c2e4", {
        "tests/v1/core/__init__.py": _EMPTY,
        "tests/v1/core/utils.py": "2bcc257bf88937ac4ad51896457475cf67dfd22ec3430205173cb8ec9430bd14",
        "tests/v1/core/test_prefix_caching.py": "3dd7341dac5c580194933b2f0de444d88aefe37a647653b8f7a751898e78e155",
        "tests/v1/core/test_single_type_kv_cache_manager.py":
            "4b5c3cf26f780ace6f44981c363f19e92a7c6a1d9d9554e96d5e395471f5f3a5",
        "tests/v1/core/test_kv_cache_metrics.py": "e48f8970ffcdaba95eaf5b95f8e54c0188664577e63081d5608008e9cae12f41",
        "tests/v1/core/test_kv_cache_utils.py": "85b9c6a1fc4ed9ff8b8e8e4b993a1ed806cd0d577a32316bf7543137d66c697d",
        "tests/v1/core/prefix_cache/test_partial_prefix_cache_primitives.py":
            "c7741abc8efe4aa9d143aa96619852374bb217a35ffcd8e50acff4ad758fd426",
    }),
    "0.26.0": Suite("23e9fa19d7e20ce7dcc1c074d41503e2116d23f19e688f5d5ea91b741f958502", {
        "tests/v1/core/__init__.py": _EMPTY,
        "tests/v1/core/utils.py": "91e9dda64030500cc14f8aeba7c4e2ab90a583295933048a01452e71c9804cf7",
        "tests/v1/core/test_prefix_caching.py": "5af456429e3b441bdf1312a3af296077dce647e5bf7bacb5b57b9db25379e431",
        "tests/v1/core/test_single_type_kv_cache_manager.py":
            "ff87e099bf6f7c74df2b11d5b75f4716a881cc4193cb22245bc12974af4082ef",
        "tests/v1/core/test_kv_cache_metrics.py": "e48f8970ffcdaba95eaf5b95f8e54c0188664577e63081d5608008e9cae12f41",
        "tests/v1/core/test_kv_cache_utils.py": "451de81c272a58262e5ed30c2b239e42aece3fd9e1502cd7e71a9c3db035531b",
        "tests/v1/core/prefix_cache/test_partial_prefix_cache_primitives.py":
            "c7741abc8efe4aa9d143aa96619852374bb217a35ffcd8e50acff4ad758fd426",
        "tests/v1/core/prefix_cache/test_partial_prefix_cache_hits.py":
            "9bb868adffac2c09adba76d9018e25445396baa83ea7417d47ef1df6b843960c",
        # support: the tests' helpers import the KV-connector tests' mock configuration
        "tests/v1/kv_connector/unit/utils.py": "fbe003b95c3f10b26b52834ef46b72ee28b30ae22ca72d9f37a0fa95a368bcd8",
    }),
    "0.27.0": Suite("862671641625d6cfb7aaab98a5386126738b59ca50e5d01ca539a4e32f63ffcb", {
        "tests/v1/core/__init__.py": _EMPTY,
        "tests/v1/core/utils.py": "d38794bc0f2be4c9957c78adb62f165dd4ccafee6ab8cb004193263efc660b42",
        "tests/v1/core/test_prefix_caching.py": "94d3de218e2580d3ef214e7d186d5b0d231247a5b20c8c718790162eb307ff2a",
        "tests/v1/core/test_single_type_kv_cache_manager.py":
            "ff87e099bf6f7c74df2b11d5b75f4716a881cc4193cb22245bc12974af4082ef",
        "tests/v1/core/test_kv_cache_metrics.py": "e48f8970ffcdaba95eaf5b95f8e54c0188664577e63081d5608008e9cae12f41",
        "tests/v1/core/test_kv_cache_utils.py": "b5f91aa09833cd19e899269fd7ef77a302bbc7af36dac7fd66e215cbd78cf986",
        "tests/v1/core/prefix_cache/test_partial_prefix_cache_primitives.py":
            "c7741abc8efe4aa9d143aa96619852374bb217a35ffcd8e50acff4ad758fd426",
        "tests/v1/core/prefix_cache/test_partial_prefix_cache_hits.py":
            "316b1f59058426fa537ea287c675c3e94b808f8923d7dcde3903d2c392bb1aae",
        "tests/v1/kv_connector/unit/utils.py": "c7edd1b041a12c634ca5e4ac1a42cc5af91a649bdbeea02a28949ccbc6b682c6",
    }),
    "0.28.0": Suite("ac96dd0ec5be9c13f2aa4bfb50498c4727110406f6e4980b58a4097e4d18634a", {
        "tests/v1/core/__init__.py": _EMPTY,
        "tests/v1/core/utils.py": "6729c7544ab3c9ddc62ac3f0d7d625f0c27234b1907ce3200314cfc920df04f7",
        "tests/v1/core/test_prefix_caching.py": "94d3de218e2580d3ef214e7d186d5b0d231247a5b20c8c718790162eb307ff2a",
        "tests/v1/core/test_single_type_kv_cache_manager.py":
            "42572635062adb9fdd39c8d7aafb5b7ee255f42fa0c358b1c9526bfa7c6a1c14",
        "tests/v1/core/test_kv_cache_metrics.py": "e48f8970ffcdaba95eaf5b95f8e54c0188664577e63081d5608008e9cae12f41",
        "tests/v1/core/test_kv_cache_utils.py": "7659e271714791818987a216c896987490f1b5248f3a24125b1f64850938565e",
        "tests/v1/core/prefix_cache/test_partial_prefix_cache_primitives.py":
            "c7741abc8efe4aa9d143aa96619852374bb217a35ffcd8e50acff4ad758fd426",
        "tests/v1/core/prefix_cache/test_partial_prefix_cache_hits.py":
            "e27b1df579a20b48b0837db018c929950f86bff123096d2c897c44ab99ba8c9d",
        "tests/v1/kv_connector/unit/utils.py": "a9283b14ad9198b08b7f2a6c3a3ea742deaac65e617bd876a00bdffaee4817e9",
    }),
    "0.29.0": Suite("c03feb07943ecae9e69e7dc424d7c5569ecf8d1292513aef2a4de67af381cd97", {
        "tests/v1/core/__init__.py": _EMPTY,
        "tests/v1/core/utils.py": "3835b199bc01cb2da200d93052210548f29f446428f5019f6d36ff9b6bc2afb0",
        "tests/v1/core/test_prefix_caching.py": "c2d91d7c609d48ff3d20ed9c7c7890ba19b4caa5cfba6f5bfc0b76bfcecc309e",
        "tests/v1/core/test_single_type_kv_cache_manager.py":
            "6e4d046427076e68a1c9e635d8ce4d628fb14f282979134900c84a142ab64b00",
        "tests/v1/core/test_kv_cache_metrics.py": "e48f8970ffcdaba95eaf5b95f8e54c0188664577e63081d5608008e9cae12f41",
        "tests/v1/core/test_kv_cache_utils.py": "a528dc95338a193cda3ce8ef150da187ec10218827f1cc332e208c4713cdfa7c",
        "tests/v1/core/prefix_cache/test_partial_prefix_cache_primitives.py":
            "38d287e3bb7963479d711da71f443176367c1c98f4d4c6b69846a5be1b8c9cea",
        "tests/v1/core/prefix_cache/test_partial_prefix_cache_hits.py":
            "1c5de702793d14e387160c48ceba61764abb28768e891fdf800d19a496c2e0d0",
        "tests/v1/kv_connector/unit/utils.py": "ffd740e42f5ef14c629a27c329279e6d1d9f50c13607d41e3d56e5021cb743a0",
    }),
    "0.30.0": Suite("5f8f4e890c042ffa1c3e103f81c35e2d96f60a0a175ac43a4adbae7006bef62b", {
        "tests/v1/core/__init__.py": _EMPTY,
        "tests/v1/core/utils.py": "214c57addc500ed762f9b40c80163831f2a0ded5d943c05a6affc1cec78fbfcb",
        "tests/v1/core/test_prefix_caching.py": "d58e818aaecee612df82d2cb931a77de3f2f92a6037a5b56446772fb15f0edfa",
        "tests/v1/core/test_single_type_kv_cache_manager.py":
            "d46acdaf3aee51f6645612dd5527f3b03c19563bd1fe945505906727491de297",
        "tests/v1/core/test_kv_cache_metrics.py": "e48f8970ffcdaba95eaf5b95f8e54c0188664577e63081d5608008e9cae12f41",
        "tests/v1/core/test_kv_cache_utils.py": "4346fc3fa1c3cabae97a122e2770d7ea4d20083207ba38435563d29f9ea60c7d",
        "tests/v1/core/prefix_cache/test_partial_prefix_cache_primitives.py":
            "f2db0a22184e0459edd1295c8ce281d37d384fc7cc00889bbd376bba526d74cf",
        "tests/v1/core/prefix_cache/test_partial_prefix_cache_hits.py":
            "d2feb76a722f171412944d8a52cdee8b8af7082b6fefbc86f2f192b237fff315",
        "tests/v1/core/prefix_cache/test_mamba_eagle_resume_checkpoint.py":
            "1a15f0fce88694b4a628bf30fb72f2e32042f59f77a8084277a4948ad039f733",
        "tests/v1/kv_connector/unit/utils.py": "3a79e77421bbaecc7a0b0db82cc2575895b17133ddc108a0fe4eabce036b68da",
    }),
    "0.31.0": Suite("dde46f1efbe846e5bd0c5c4ec6ec71842c42254c7ff3d9bebb2a57028715d380", {
        "tests/v1/core/__init__.py": _EMPTY,
        "tests/v1/core/utils.py": "2e7071e98e83c685ed230982ba46dfccb95191f725578bb915a57ab239032694",
        "tests/v1/core/test_prefix_caching.py": "bf10471a1fa44ff38a7cb733c83ed77571ca8982ae933cc80e3bf26b25f20348",
        "tests/v1/core/test_single_type_kv_cache_manager.py":
            "6728ec798f9a47eb5a63af8f74d3981362a87de9690580141e57ee67027a93c4",
        "tests/v1/core/test_kv_cache_metrics.py": "e48f8970ffcdaba95eaf5b95f8e54c0188664577e63081d5608008e9cae12f41",
        "tests/v1/core/test_kv_cache_utils.py": "56254f83b4088809a9b5abe9888c66886cf6d18b91407024baaca80ad410bf49",
        "tests/v1/core/prefix_cache/test_partial_prefix_cache_primitives.py":
            "4690f15c17e09b3c4b0f78a3a6f131189db336b58229c99100b10c5dfe6e7e22",
        "tests/v1/core/prefix_cache/test_partial_prefix_cache_hits.py":
            "610ed4c1b80b3e3c193ef52119da4dd1db3bbc3cad5b63f77a552bd76901cf71",
        "tests/v1/core/prefix_cache/test_mamba_eagle_resume_checkpoint.py":
            "00dd142a96ebff8626e1b58d61b6494ea56606ed07c71ff2a9d99db1eca52fd5",
        "tests/v1/kv_connector/unit/utils.py": "f77a3a8989976f812b066c19ce23ca6fab7486dd7ff21d647f4ffdfb4f039ff0",
    }),
    "0.32.0": Suite("d2c957d5eee3d0985012151315ddc62cbe0cd368fc96a5fc3510438d9dddf2ad", {
        "tests/v1/core/__init__.py": _EMPTY,
        "tests/v1/core/utils.py": "19313b305ce016a2b1763154e41208a7066b2268ec0d0e1db858b15f71cdcc19",
        "tests/v1/core/test_prefix_caching.py": "72e355a87950d2d7e13645103b8e83d714c78c9281180aea85b4d7586b7de32f",
        "tests/v1/core/test_single_type_kv_cache_manager.py":
            "2dc9daac02f2fbc09e2787f4dfa3c7c556f2c3f7fcfcef9ffade8efaa595c13f",
        "tests/v1/core/test_kv_cache_metrics.py": "e48f8970ffcdaba95eaf5b95f8e54c0188664577e63081d5608008e9cae12f41",
        "tests/v1/core/test_kv_cache_utils.py": "36ce15c73ef8b79486ffa48a6d214e7a4fe5107bed0bd178c056d9f4161c1651",
        "tests/v1/core/prefix_cache/test_partial_prefix_cache_primitives.py":
            "4690f15c17e09b3c4b0f78a3a6f131189db336b58229c99100b10c5dfe6e7e22",
        "tests/v1/core/prefix_cache/test_partial_prefix_cache_hits.py":
            "f716fb719c291adc0eedf81bd963e62f549a251f6bf65c0f45714eb531ac76f0",
        "tests/v1/core/prefix_cache/test_mamba_eagle_resume_checkpoint.py":
            "00dd142a96ebff8626e1b58d61b6494ea56606ed07c71ff2a9d99db1eca52fd5",
        "tests/v1/kv_connector/unit/utils.py": "7ec9051f3b04868c6f1c5a8052b85f9b7b51e6ddb3eaa25dbfdc1350ce664a82",
    }),
    "0.33.0": Suite("f4c33c2503d52bb411146afa9618a4f48bed68912f617e6803ac8d76e4c74112", {
        "tests/v1/core/__init__.py": _EMPTY,
        "tests/v1/core/utils.py": "7df042f9487aeb2f8290b48b302d7a6d76db8efccc102849c18b1d36a19e97f8",
        "tests/v1/core/test_prefix_caching.py": "6f5c8c744fc84e20b9d6b154fd30e3e9c39c8022b14c0bc94504d9822293393a",
        "tests/v1/core/test_single_type_kv_cache_manager.py":
            "5b9a6795530b105d327f1b684b7bb74460188200b7233c6c4b631c7759a4911e",
        "tests/v1/core/test_kv_cache_metrics.py": "e48f8970ffcdaba95eaf5b95f8e54c0188664577e63081d5608008e9cae12f41",
        "tests/v1/core/test_kv_cache_utils.py": "82dfa1aeda651733300a57bc6c4360ea07270ed90de551acb10b21280134a604",
        "tests/v1/core/prefix_cache/test_partial_prefix_cache_primitives.py":
            "4690f15c17e09b3c4b0f78a3a6f131189db336b58229c99100b10c5dfe6e7e22",
        "tests/v1/core/prefix_cache/test_partial_prefix_cache_hits.py":
            "f81ed5be56b3b6163e9c640062036ae40e41a24e6f7218a1c96bbae2e356d64a",
        "tests/v1/core/prefix_cache/test_mamba_eagle_resume_checkpoint.py":
            "3ff69e018de620c6b317c4fed54aaab162aed4191c071f7070d397c810341ac1",
        "tests/v1/kv_connector/unit/utils.py": "11f6a0add5a5b711a12d2d5635a8a9d33c12e7a93d8138ad6d9335b65f05326e",
    }),
    "0.34.0": Suite("fcad848b246a9d8652b47e6425af92334dc02492f9802720f54e27b823cf0113", {
        "tests/v1/core/__init__.py": _EMPTY,
        "tests/v1/core/utils.py": "ae566ab7afa33357dae68bc1d764828f70817c9490f2f6ac841279ce3e805b3b",
        "tests/v1/core/test_prefix_caching.py": "f94ae5b061fa209845168b8b2dff2389a233e4ad0a7b83154805594c072f45c9",
        "tests/v1/core/test_single_type_kv_cache_manager.py":
            "5b9a6795530b105d327f1b684b7bb74460188200b7233c6c4b631c7759a4911e",
        "tests/v1/core/test_kv_cache_metrics.py": "e48f8970ffcdaba95eaf5b95f8e54c0188664577e63081d5608008e9cae12f41",
        "tests/v1/core/test_kv_cache_utils.py": "ae080196d8270b1b8255e0a9ec348eeeb6e22427330935b97380e00e3369a6a3",
        # The engine's prompt block hashes pinned against the vectors vLLM's Rust frontend reproduces.
        "tests/v1/core/test_prompt_block_hash_vectors.py":
            "12bd8cb2ace880e17fa348fa4ecbc262b5d79f8690c2039603e76eddd4908a09",
        "rust/src/engine-core-client/src/tests/prompt_block_hash_vectors.json":
            "8ab1c34ac62bb61aa39119c77dda053b7d9a382d6072d4875cf81dae84ad2df9",
        "tests/v1/core/prefix_cache/test_partial_prefix_cache_primitives.py":
            "4690f15c17e09b3c4b0f78a3a6f131189db336b58229c99100b10c5dfe6e7e22",
        "tests/v1/core/prefix_cache/test_partial_prefix_cache_hits.py":
            "f81ed5be56b3b6163e9c640062036ae40e41a24e6f7218a1c96bbae2e356d64a",
        "tests/v1/core/prefix_cache/test_mamba_eagle_resume_checkpoint.py":
            "3ff69e018de620c6b317c4fed54aaab162aed4191c071f7070d397c810341ac1",
        "tests/v1/kv_connector/unit/utils.py": "c479762f374e80f50760e85611c2def22eb2ec3c6a019c48aa1b862c0f93fe91",
    }),
}
"""The releases whose tests this runs (each also one the drop-in knows)."""

CONFTEST = '''"""kvspec's conftest for vLLM's tests: vLLM's markers, and with
KVSPEC_DROPIN=1 kvspec's block manager in place of vLLM's before any test
module imports it."""

import os

if os.environ.get("KVSPEC_DROPIN") == "1":
    import kvspec.dropin

    kvspec.dropin.install()


def pytest_configure(config):
    for marker in ("cpu_test", "core_model", "slow_test"):
        config.addinivalue_line("markers", f"{marker}: vLLM's marker")
'''


class PeerSuiteError(Exception):
    """The test files cannot be had, or are not the published ones."""


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sdist_name(release: str) -> str:
    return f"vllm-{release}.tar.gz"


def fetch_sdist(cache: Path, release: str) -> Path:
    """vLLM ``release``'s source archive from PyPI (cached)."""
    path = cache / sdist_name(release)
    if path.exists():
        return path
    cache.mkdir(parents=True, exist_ok=True)
    index = urllib.request.urlopen("https://pypi.org/simple/vllm/", timeout=60).read().decode()
    urls = re.findall(rf'href="([^"]*/{re.escape(sdist_name(release))})#sha256=[0-9a-f]+"', index)
    if not urls:
        raise PeerSuiteError(f"PyPI's index lists no {sdist_name(release)}")
    tmp = path.with_suffix(".part")
    urllib.request.urlretrieve(urls[0], tmp)
    tmp.rename(path)
    return path


def extract(sdist: Path, release: str, into: Path) -> dict[str, str]:
    """The release's test files, checked, written under ``into``; their checksums."""
    suite = SUITES[release]
    data = sdist.read_bytes()
    if sha256(data) != suite.sdist_sha256:
        raise PeerSuiteError(f"{sdist} is not vLLM {release}'s published archive (SHA-256 {sha256(data)})")
    sums = {}
    with tarfile.open(sdist) as archive:
        for name, expected in suite.files.items():
            try:
                member = archive.extractfile(f"vllm-{release}/{name}")
            except KeyError:
                member = None
            if member is None:
                raise PeerSuiteError(f"{name} is not in {sdist}")
            content = member.read()
            sums[name] = sha256(content)
            if sums[name] != expected:
                raise PeerSuiteError(f"{name}: SHA-256 {sums[name]}, expected {expected}")
            target = into / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(content)
    for name in suite.files:  # every directory on the way a package, as in vLLM's tree
        for parent in Path(name).parents:
            if parent != Path("."):
                (into / parent / "__init__.py").touch()
    (into / "conftest.py").write_text(CONFTEST)
    return sums


def vllm_path(release: str, python: str) -> str | None:
    """What goes first on ``PYTHONPATH`` for vLLM ``release``: nothing when
    ``python``'s own vLLM is that release, else the release's tree, installed
    alone under kvspec's cache (``kvspec.conformance.vllm.upstream``)."""
    probe = subprocess.run([python, "-c", "import vllm; print(vllm.__version__)"], capture_output=True, text=True)
    if probe.returncode == 0 and probe.stdout.strip().split("+")[0] == release:
        return None
    from kvspec.conformance.vllm import upstream
    from kvspec.errors import SetupError

    try:
        return os.pathsep.join(upstream.release_path(upstream.install(release, python)))
    except SetupError as error:
        raise PeerSuiteError(f"vLLM {release} cannot be installed here: {error}") from error


def run(into: Path, dropin: bool, junit: Path, workers: int, path: str | None) -> None:
    env = dict(os.environ, PYTHONHASHSEED="0", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               KVSPEC_DROPIN="1" if dropin else "0")
    if path:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, (path, env.get("PYTHONPATH"))))
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--junitxml", str(junit),
           "-W", "ignore::DeprecationWarning", "tests/v1/core"]
    if workers > 1:
        cmd += ["-n", str(workers)]
    subprocess.run(cmd, cwd=into, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=1800)
    if not junit.exists():
        raise PeerSuiteError(f"pytest wrote no report ({'kvspec' if dropin else 'vLLM'} run)")


def outcomes(junit: Path) -> dict[str, tuple[str, str]]:
    """test id -> (passed / failed / skipped, first line of the failure)."""
    out = {}
    for case in ET.parse(junit).iter("testcase"):
        test = f"{case.get('classname', '').replace('.', '/')}.py::{case.get('name')}"
        test = re.sub(r"^(.*)/([^/]+)\.py::", lambda m: f"{m.group(1)}/{m.group(2)}.py::", test)
        problem = case.find("failure") if case.find("failure") is not None else case.find("error")
        if problem is not None:
            message = (problem.get("message") or problem.text or "").strip().splitlines()
            out[test] = ("failed", message[0][:160] if message else "")
        elif case.find("skipped") is not None:
            out[test] = ("skipped", "")
        else:
            out[test] = ("passed", "")
    return out


def compare(vllm: dict[str, tuple[str, str]], ours: dict[str, tuple[str, str]],
            differences: dict[str, str]) -> tuple[list[tuple[str, str, str, str]], list[str]]:
    """The table rows (test, vLLM, kvspec, note) and the problems that fail the run."""
    rows, problems = [], []
    for test in sorted(set(vllm) | set(ours)):
        theirs, mine = vllm.get(test, ("missing", ""))[0], ours.get(test, ("missing", ""))
        note = ""
        if theirs == "passed" and mine[0] != "passed":
            note = differences.get(test, "")
            if not note:
                problems.append(f"{test}: passes on vLLM, {mine[0]} on kvspec: {mine[1]}")
                note = f"UNEXPLAINED: {mine[1]}"
        elif test in differences:
            problems.append(f"{test}: listed as a difference, but {mine[0]} on kvspec and {theirs} on vLLM")
            note = "listed difference no longer holds"
        elif theirs == "failed":
            note = f"fails on vLLM too: {vllm[test][1]}"
        rows.append((test, theirs, mine[0], note))
    return rows, problems


def table(rows: list[tuple[str, str, str, str]], release: str) -> list[str]:
    lines = [f"| test | vLLM {release} | kvspec drop-in | note |", "|---|---|---|---|"]
    lines += [f"| `{t}` | {a} | {b} | {n} |" for t, a, b, n in rows]
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--release", default=BASE, help=f"the vLLM release whose tests run (default {BASE}; "
                        f"known: {', '.join(SUITES)})")
    parser.add_argument("--sdist", type=Path, help="a local copy of the release's source archive "
                        "(default: download, cached)")
    parser.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "kvspec", help="download cache")
    parser.add_argument("--markdown", type=Path, help="write the table here too")
    parser.add_argument("--workers", type=int, default=2, help="pytest-xdist workers (default 2)")
    args = parser.parse_args(argv)
    from kvspec.dropin_releases import API

    release = args.release
    if release not in SUITES or release not in API:
        known = [r for r in SUITES if r in API]
        print(f"peer suite: error: no suite for vLLM {release!r} (known: {', '.join(known)})", file=sys.stderr)
        return 2
    try:
        sdist = args.sdist or fetch_sdist(args.cache, release)
        path = vllm_path(release, sys.executable)
        with tempfile.TemporaryDirectory(prefix="kvspec-peer-") as scratch:
            into = Path(scratch)
            sums = extract(sdist, release, into)
            run(into, False, into / "vllm.xml", args.workers, path)
            run(into, True, into / "kvspec.xml", args.workers, path)
            theirs, ours = outcomes(into / "vllm.xml"), outcomes(into / "kvspec.xml")
    except (PeerSuiteError, OSError, subprocess.SubprocessError) as error:
        print(f"peer suite: error: {error}", file=sys.stderr)
        return 2
    differences = json.loads(DIFFERENCES.read_text()).get(release, {}) if DIFFERENCES.exists() else {}
    rows, problems = compare(theirs, ours, differences)
    lines = table(rows, release)
    counts = {who: sum(1 for r in rows if r[i] == "passed") for who, i in (("vLLM", 1), ("kvspec", 2))}
    summary = (f"vLLM {release}'s block-manager tests: {len(rows)}; passed on vLLM {counts['vLLM']}, "
               f"on kvspec's drop-in {counts['kvspec']}; {len(differences)} listed differences; "
               f"{len(problems)} unexplained")
    print("\n".join(lines))
    print()
    print("files (SHA-256): " + ", ".join(f"{n.rsplit('/', 1)[-1]} {s[:12]}" for n, s in sums.items()))
    print(summary)
    for problem in problems:
        print(f"  {problem}")
    if args.markdown:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text("\n".join([summary, "", *lines, ""]))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
