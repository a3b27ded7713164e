"""One ``pitlab run`` per run folder (pitlab.api.runfolders.lock_run_folders): found by a trial, where a second
``pitlab run --resume`` took the first run's checkpoints while it still trained and the first then failed on the
metrics file the second had rewritten."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from pitlab.api import SpecError
from pitlab.api.runfolders import lock_run_folders

HOLDER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from pitlab.api.runfolders import lock_run_folders
    held = lock_run_folders(Path(sys.argv[1]), ["base"], Path(sys.argv[2]))
    print("held", flush=True)
    sys.stdin.readline()  # until the test closes stdin
""")


def test_a_second_process_is_refused_while_the_first_holds_the_folder(tmp_path):
    locks = tmp_path / "locks"
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path / "out"), str(locks)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(SpecError) as err:
            lock_run_folders(tmp_path / "out", ["eval", "base"], locks)
        field, message = err.value.problems[0]
        assert field == "spec.output.uri"
        assert message.startswith(f"{(tmp_path / 'out' / 'base').resolve()} is in use by another pitlab process "
                                  f"(pid {holder.pid}, lock {locks}/")
        assert len(lock_run_folders(tmp_path / "out", ["eval"], locks)) == 1  # another folder is free
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
    held = lock_run_folders(tmp_path / "out", ["eval", "base"], locks)  # free once the first process ended
    assert len(held) == 2 and not (tmp_path / "out").exists()  # nothing written into the output folder
