"""`strata cluster`'s flags: a bad one names itself and nothing starts (no Ray)."""

from __future__ import annotations

import pytest

from strata.cli import main


@pytest.mark.parametrize(("argv", "named"), [
    (["--replicas", "0"], "--replicas"),
    (["--replicas", "3", "--max-replicas", "2"], "--max-replicas"),
    (["--route-block", "0"], "--route-block"),
    (["--replica-cpus", "-1"], "--replica-cpus"),
    (["--batch", "-1"], "--batch"),
])
def test_a_bad_flag_is_named(argv, named, capsys):
    try:
        code = main(["cluster", *argv])
    except SystemExit as exit_:  # argparse's own checks
        code = exit_.code
    assert code == 2
    assert named in capsys.readouterr().err
