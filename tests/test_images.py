"""The container images (images/*/Dockerfile) and constraints.txt: pinned, non-root, and what CI tested.

Images are not built here (no container engine); these tests read the Dockerfiles as text."""

from __future__ import annotations

import re
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
IMAGES = sorted(p.parent.name for p in (ROOT / "images").glob("*/Dockerfile"))


def constraints() -> dict[str, str]:
    """constraints.txt as {canonical name: pinned version}; every line is ``name==version``."""
    pins = {}
    for n, line in enumerate((ROOT / "constraints.txt").read_text().splitlines(), 1):
        if line.strip() and not line.startswith("#"):
            m = re.fullmatch(r"([A-Za-z0-9_.\-]+)==([^\s;]+)", line.strip())
            assert m, f"constraints.txt line {n} is not name==version: {line!r}"
            pins[canonicalize_name(m.group(1))] = m.group(2)
    return pins


def runtime_requirements() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = project["dependencies"] + project["optional-dependencies"]["operator"]
    return [Requirement(r) for r in reqs]


def test_three_images():
    assert IMAGES == ["evaluator", "operator", "trainer"]


@pytest.mark.parametrize("image", IMAGES)
def test_dockerfile_is_pinned_and_non_root(image):
    text = (ROOT / "images" / image / "Dockerfile").read_text()
    bases = re.findall(r"^(?:ARG BASE_IMAGE=|FROM )(\S+)", text, flags=re.M)
    concrete = [b for b in bases if not b.startswith("$")]
    assert concrete, f"{image}: no base image"
    for base in concrete:  # a versioned tag, never latest
        name, _, tag = base.partition(":")
        assert tag and tag != "latest" and re.search(r"\d+\.\d+", tag), f"{image}: base {base} is not pinned"
    users = re.findall(r"^USER (\S+)", text, flags=re.M)
    assert users, f"{image}: no USER"
    uid = users[-1].split(":")[0]
    assert uid.isdigit() and int(uid) >= 1000, f"{image}: runs as {users[-1]}"
    installs = re.findall(r"pip install[^\n\\]*", text)
    assert installs and all("-c constraints.txt" in i or "--no-deps" in i for i in installs), installs
    assert re.search(r"^COPY .*constraints\.txt", text, flags=re.M)


def test_constraints_pin_every_runtime_dependency_within_pyproject():
    pins = constraints()
    for req in runtime_requirements():
        name = canonicalize_name(req.name)
        assert name in pins, f"constraints.txt lacks {req.name} (pyproject: {req})"
        assert req.specifier.contains(pins[name], prereleases=True), \
            f"constraints.txt pins {req.name}=={pins[name]}, outside pyproject's {req.specifier}"


def test_this_environment_runs_the_pinned_versions():
    """make install uses -c constraints.txt, so the tested environment is the pinned one (a package upgraded
    by hand, or a pyproject change without `make lock`, fails here)."""
    pins = constraints()
    wrong = {}
    for name, version in pins.items():
        try:
            got = metadata.version(name)
        except metadata.PackageNotFoundError:
            wrong[name] = (version, None)
            continue
        if got.split("+")[0] != version:
            wrong[name] = (version, got)
    assert not wrong, f"pinned vs installed: {wrong}"


def test_the_operator_runs_with_only_what_its_image_installs():
    """The operator image installs pitlab without dependencies plus pydantic, pyyaml, kopf and kubernetes: its
    lifecycle and kmock end-to-end tests pass in a process where every other package pitlab uses is unimportable
    (tests/image_deps_guard.py). The import chain operator → pipeline → evaluator once pulled numpy into it."""
    import subprocess
    import sys

    from image_deps_guard import MISSING_FROM_OPERATOR_IMAGE

    installed = re.search(r"pip install -c constraints\.txt ([^&\\\n]+)", (ROOT / "images/operator/Dockerfile")
                          .read_text()).group(1).split()
    assert installed == ["pydantic", "pyyaml", "kopf", "kubernetes"]
    assert not set(installed) & set(MISSING_FROM_OPERATOR_IMAGE)
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "image_deps_guard", "-p", "no:cacheprovider",
                        "test_operator_lifecycle.py", "test_operator_e2e.py"], cwd=ROOT / "tests",
                       capture_output=True, text=True, timeout=900)
    tail = r.stdout.strip().splitlines()[-1] if r.stdout.strip() else r.stderr[-2000:]
    assert r.returncode == 0 and re.search(r"\d+ passed", tail) and "error" not in tail, r.stdout[-4000:]
