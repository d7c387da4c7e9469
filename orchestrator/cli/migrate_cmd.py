"""``bcrit migrate-checkpoint OLD NEW --trust``: convert a trial checkpoint written by an older bcrit (whose files
hold pickled Python objects) into the data format every bcrit reader opens with ``weights_only=True``.

Converting means unpickling OLD's files fully, which runs any code a crafted file carries: the only place bcrit
does so, and only behind ``--trust`` (docs/security.md). Bad input (no ``--trust``, OLD not a checkpoint, NEW
existing) -> one line, exit 2, nothing written."""

from __future__ import annotations

import os

from orchestrator.cli import options
from orchestrator.errors import UserError


def register(sub) -> None:
    """Add the ``migrate-checkpoint`` sub-command to ``bcrit``'s sub-parsers."""
    p = options.command(
        sub,
        "migrate-checkpoint",
        "convert a trusted old checkpoint to data only",
        "Convert a trusted checkpoint of an older bcrit into the data-only format.",
        [
            "bcrit migrate-checkpoint runs/base/checkpoint_step00000100 /tmp/ckpt-new --trust",
            "bcrit probe /tmp/ckpt-new                        # then read like any checkpoint",
        ],
    )
    p.add_argument("old", metavar="OLD", help="trial checkpoint directory of an older bcrit (holds state.pt)")
    p.add_argument("new", metavar="NEW", help="directory to create with the converted checkpoint (must not exist)")
    p.add_argument("--trust", action="store_true", help="required: you trust OLD's source (it will be unpickled)")
    p.set_defaults(func=migrate_command)


def migrate_command(args) -> int:
    from trainables.checkpoint import STATE_FILE

    old, new = os.path.abspath(args.old), os.path.abspath(args.new)
    if not os.path.isfile(os.path.join(old, STATE_FILE)):
        raise UserError(f"{args.old} is not a bcrit trial checkpoint directory (no {STATE_FILE})")
    if not args.trust:
        raise UserError(
            f"converting {args.old} unpickles its files, which runs any code they hold; add --trust only if you "
            "trust where the checkpoint came from"
        )
    if os.path.lexists(new):
        raise UserError(f"{args.new} exists; give a new directory (move it over the old one afterwards if you like)")
    if not os.path.isdir(os.path.dirname(new)):
        raise UserError(f"{args.new}: its parent directory does not exist")
    from trainables.checkpoint import migrate

    try:
        unpickled = migrate(old, new)
    except OSError as e:
        raise UserError(f"cannot write {args.new}: {e.strerror}") from None
    except Exception as e:  # noqa: BLE001 - a trusted but unreadable file: name it, one line
        raise UserError(
            f"{args.old} could not be converted ({type(e).__name__}: {str(e).splitlines()[0][:160]})"
        ) from None
    done = f"converted {', '.join(unpickled)}" if unpickled else "nothing held Python objects; copied"
    print(f"bcrit migrate-checkpoint: {done}; {args.new} loads as data now")
    return 0
