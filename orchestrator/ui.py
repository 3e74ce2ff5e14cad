"""The MLflow UI on a storage folder's store, wherever the folder is now (its artifact records are
re-pointed at it first: `tracking.rebase`), on 127.0.0.1.

  python -m orchestrator.ui runs            # then open http://127.0.0.1:5000
  python -m orchestrator.ui /copied/runs --port 5001
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from orchestrator.inputs import SpecError
from orchestrator.tracking import rebase


def command(storage: Path, port: int) -> list[str]:
    """`mlflow ui` on the storage's sqlite store, bound to this machine only."""
    return [
        sys.executable,
        "-m",
        "mlflow",
        "ui",
        "--backend-store-uri",
        f"sqlite:///{storage / 'mlflow.db'}",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m orchestrator.ui",
        description=__doc__.strip(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("storage", help="a storage folder: the one holding mlflow.db and mlartifacts/")
    parser.add_argument("--port", type=int, default=5000, help="(default: 5000)")
    args = parser.parse_args(argv)
    storage = Path(args.storage).expanduser().resolve()
    if not (storage / "mlflow.db").is_file():
        print(f"storage: {storage} holds no mlflow.db (expected a storage folder, such as runs/)", file=sys.stderr)
        return 2
    if not 0 < args.port < 65536:
        print(f"--port: expected 1 to 65535 (got {args.port})", file=sys.stderr)
        return 2
    try:
        rebase(storage / "mlflow.db")
    except SpecError as e:
        print(e, file=sys.stderr)
        return 2
    os.execv(sys.executable, command(storage, args.port))


if __name__ == "__main__":
    sys.exit(main())
