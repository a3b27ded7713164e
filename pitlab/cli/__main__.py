"""``python -m pitlab.cli`` (and ``torchrun -m pitlab.cli train``, the pods' command)."""

from pitlab.cli import app

if __name__ == "__main__":
    app()
