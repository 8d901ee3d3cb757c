"""Put a vLLM source tree's Python code over an installed vLLM wheel: how a
fork, a pull request or vLLM main runs on a CPU machine with no CUDA build.

    python tools/overlay_vllm.py SOURCE SITE_VLLM

``SOURCE`` is a vLLM checkout (a directory holding ``vllm/__init__.py``),
or a git URL, optionally ``URL@REF`` (a branch, tag or commit), cloned
shallowly into a temporary directory.  ``SITE_VLLM`` is the installed
package's directory (``.../site-packages/vllm``), installed from the wheel
of the release the source is based on.  Every file of the source's
``vllm/`` package replaces or joins the wheel's -- compiled extensions
(``*.so``), caches and ``_version.py`` excepted, which stay the wheel's: the block manager,
the scheduler and the worker code kvspec drives are pure Python, so the
overlay runs *the source's* code, with the wheel's compiled parts beneath
it.  The wheel's version number stays, so kvspec judges the overlay by the
rules of the release it is based on (``kvspec conform --release X`` says
otherwise).

What was overlaid is written to ``SITE_VLLM/KVSPEC_OVERLAY.json`` (the
source, its git commit when it has one, the files copied), so that a report
or the version matrix can name the commit it judged.  Prints one line;
exit 2 with one line on a source that is no vLLM tree, an installed package
that is not there, or a clone that fails.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

KEPT = (".so", ".pyd", ".pyc")  # the wheel's compiled parts (and caches) stay
VERSION_FILE = "_version.py"  # the wheel's version stays: the release the source is judged as
RECORD = "KVSPEC_OVERLAY.json"


class OverlayError(Exception):
    """A source or target that cannot be overlaid: one line for the user."""


def is_git_url(source: str) -> bool:
    return source.startswith(("git+", "https://", "http://", "ssh://", "git@", "file://"))


def clone(url: str, into: Path) -> Path:
    """A shallow clone of ``URL[@REF]`` under ``into``; returns the checkout."""
    url = url.removeprefix("git+")
    ref = None
    if "@" in url.rsplit("/", 1)[-1]:
        url, ref = url.rsplit("@", 1)
    checkout = into / "vllm-source"
    command = ["git", "clone", "--quiet", "--depth", "1", *(["--branch", ref] if ref else []), url, str(checkout)]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0 and ref:  # a commit, not a branch or tag: fetch it
        done = subprocess.run(["git", "clone", "--quiet", url, str(checkout)], capture_output=True, text=True)
        if done.returncode == 0:
            done = subprocess.run(["git", "-C", str(checkout), "checkout", "--quiet", ref], capture_output=True,
                                  text=True)
    if done.returncode != 0:
        raise OverlayError(f"cannot clone {url}{'@' + ref if ref else ''}: {done.stderr.strip().splitlines()[-1:]}")
    return checkout


def commit_of(checkout: Path) -> str | None:
    """The checkout's git commit, or None when it is no git work tree."""
    done = subprocess.run(["git", "-C", str(checkout), "rev-parse", "HEAD"], capture_output=True, text=True)
    return done.stdout.strip() if done.returncode == 0 else None


def overlay(checkout: Path, site_vllm: Path, source: str) -> dict:
    """Copy ``checkout/vllm`` over ``site_vllm``; returns the record written."""
    package = checkout / "vllm"
    if not (package / "__init__.py").is_file():
        raise OverlayError(f"{source} is no vLLM source tree: {package / '__init__.py'} does not exist")
    if not (site_vllm / "__init__.py").is_file():
        raise OverlayError(f"{site_vllm} is no installed vLLM package (install the base release's wheel first)")
    if package.resolve() == site_vllm.resolve():  # each file would be unlinked, then copied from itself
        raise OverlayError(f"{site_vllm} is the source's own vllm/ package, not an installed one (asked from "
                           f"inside the checkout, Python finds the checkout first)")
    copied = []
    for path in sorted(package.rglob("*")):
        relative = path.relative_to(package)
        if path.is_dir() or "__pycache__" in relative.parts or path.suffix in KEPT or str(relative) == VERSION_FILE:
            continue
        target = site_vllm / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.exists() or target.is_symlink():
            target.unlink()  # replaced, never written through (a link farm's original stays as it was)
        shutil.copy2(path, target)
        copied.append(str(relative))
    record = {"source": source, "commit": commit_of(checkout), "files": len(copied)}
    (site_vllm / RECORD).write_text(json.dumps({**record, "copied": copied}, indent=1))
    return record


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: overlay_vllm.py SOURCE SITE_VLLM", file=sys.stderr)
        return 2
    source, site_vllm = argv[0], Path(argv[1])
    try:
        with tempfile.TemporaryDirectory(prefix="kvspec-vllm-source-") as scratch:
            checkout = clone(source, Path(scratch)) if is_git_url(source) else Path(source).expanduser()
            record = overlay(checkout, site_vllm, source)
    except OverlayError as error:
        print(f"overlay_vllm: error: {error}", file=sys.stderr)
        return 2
    commit = f" at {record['commit'][:12]}" if record["commit"] else ""
    print(f"overlaid {record['files']} files of {source}{commit} on {site_vllm}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
