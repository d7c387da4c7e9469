"""``bcrit probe CHECKPOINT``: per-timestep-bin gradient noise scale of a saved trial checkpoint.

Unbiased two-batch estimators (McCandlish et al. 2018, arXiv 1812.06162, App. A.1), repeated ``--reps`` times
with independent seeded draws -> means and standard errors; see ``trainables.probe``. Bad input -> one line, exit 2.
"""

from __future__ import annotations

import json

from orchestrator.cli import options
from orchestrator.errors import UserError


def register(sub) -> None:
    """Add the ``probe`` sub-command to ``bcrit``'s sub-parsers."""
    p = options.command(
        sub,
        "probe",
        "gradient noise scale per timestep bin of a checkpoint",
        "The gradient noise scale per timestep bin of a trial checkpoint, with its SE.",
        [
            "bcrit probe CHECKPOINT                 # the directory on bcrit train's last line",
            "bcrit probe CHECKPOINT --bins 1 --reps 32 --ema --json probe.json",
        ],
    )
    p.add_argument("checkpoint", metavar="CHECKPOINT", help="trial checkpoint directory (holds state.pt)")
    p.add_argument("--bins", type=int, default=None, metavar="K", help="timestep bins (default: the trial's)")
    p.add_argument("--b", type=int, default=16, dest="b", help="small batch size b (default 16)")
    p.add_argument("--B", type=int, default=64, dest="B", help="big batch size B, a multiple of b (default 64)")
    p.add_argument(  # = trainables.probe.DEFAULT_REPS (not imported: the CLI starts without torch)
        "--reps", type=int, default=16, metavar="N", help="independent repetitions, >= 2 (default 16: an honest SE)"
    )
    p.add_argument("--ema", action="store_true", help="probe the EMA weights instead of the training weights")
    options.seed(p)
    p.add_argument("--json", default=None, metavar="FILE", help="also write the results as JSON")
    p.set_defaults(func=probe_command)


def check_output_file(path: str, flag: str) -> None:
    """The file ``path`` can be written: checked before minutes of compute, leaving nothing behind."""
    import os
    import tempfile

    full = os.path.abspath(path)
    directory = os.path.dirname(full)
    if os.path.isdir(full):
        raise UserError(f"{flag} {path}: is a directory; give a file name")
    if not os.path.isdir(directory):
        raise UserError(f"{flag} {path}: its directory does not exist")
    try:  # os.access says yes to root even on /proc: try it
        os.rmdir(tempfile.mkdtemp(prefix=".bcrit-write-test-", dir=directory))
        if os.path.exists(full):
            with open(full, "a"):
                pass
    except OSError as e:
        raise UserError(f"{flag} {path}: not writable ({e.strerror}); choose another file") from None


def probe_command(args) -> int:
    from trainables.probe import ProbeError, format_table, probe

    if args.json:
        check_output_file(args.json, "--json")
    try:
        result = probe(
            args.checkpoint, bins=args.bins, b=args.b, B=args.B, reps=args.reps, ema=args.ema, seed=args.seed
        )
    except ProbeError as e:
        raise UserError(str(e)) from None
    weights = "EMA" if args.ema else "training"
    header = (
        f"checkpoint {result['checkpoint']}  step {result['step']}  {weights} weights  "
        f"b={args.b} B={args.B} reps={args.reps} seed={args.seed}"
    )
    print(format_table(result, header))
    if args.json:
        try:
            with open(args.json, "w") as f:
                json.dump(result, f, indent=2)
        except OSError as e:
            raise UserError(f"cannot write {args.json}: {e.strerror}") from None
    return 0
