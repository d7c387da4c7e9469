"""``bcrit pack-latents FOLDER OUT``: a fast-DiT latent folder -> one memory-mapped store that trials read by
index (`trainables.data.latent_store`). Resumable: run the same command again after a kill. Bad input (a
missing folder, a wrong-shaped file, a label out of range, an OUT holding something else) -> one line, exit 2."""

from __future__ import annotations

from orchestrator.cli import options
from orchestrator.errors import UserError


def register(sub) -> None:
    """Add the ``pack-latents`` sub-command to ``bcrit``'s sub-parsers."""
    p = options.command(
        sub,
        "pack-latents",
        "pack a fast-DiT latent folder into one store",
        "Pack a fast-DiT latent folder into one memory-mapped store that trials read.",
        [
            "bcrit pack-latents /data/imagenet256-features /data/imagenet256-store       # float32, exact",
            "bcrit pack-latents /data/imagenet256-features /data/imagenet256-store-bf16 --dtype bfloat16",
        ],
    )
    p.add_argument("folder", metavar="FOLDER", help="folder holding imagenet256_features/ and imagenet256_labels/")
    p.add_argument("out", metavar="OUT", help="store directory to create (or to continue, after an interrupted pack)")
    p.add_argument(
        "--dtype",
        default="float32",
        choices=["float32", "float16", "bfloat16"],
        help="storage precision (default float32, exact); the relative error of the others is measured and printed",
    )
    p.add_argument(
        "--num-classes", type=int, default=1000, metavar="N", help="labels must lie in 0..N-1 (default 1000)"
    )
    p.add_argument("--chunk", type=int, default=1024, metavar="N", help="latents per committed chunk (default 1024)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=pack_command)


def pack_command(args) -> int:
    import os

    from trainables.data import DatasetError
    from trainables.data.latent_store import pack

    if not os.path.isdir(args.folder):
        raise UserError(f"{args.folder}: no such folder; give a fast-DiT feature folder")
    if args.chunk < 1:
        raise UserError(f"--chunk must be >= 1, got {args.chunk}")
    try:
        m = pack(args.folder, args.out, args.dtype, args.num_classes, chunk=args.chunk, progress=not args.no_progress)
    except DatasetError as e:
        raise UserError(str(e)) from None
    except OSError as e:
        raise UserError(f"cannot write {args.out}: {e.strerror}") from None
    size = sum(os.path.getsize(os.path.join(args.out, f)) for f in os.listdir(args.out))
    print(
        f"store {args.out}: {m['count']} latents {tuple(m['shape'])} {m['dtype']}, {size / 2**20:.1f} MiB, "
        f"relative error {m['rel_error']:.2e}; use it with  dataset: {args.out}"
    )
    return 0
