"""The `neuron-eager` command: `neuron-eager bench ...`, `neuron-eager conformance ...`."""
from __future__ import annotations

import sys

COMMANDS = {
    "bench": ("neuron_eager.bench", "plain vs adaptive eager (and torch CPU): table, JSON, plot"),
    "conformance": ("neuron_eager.conformance", "PyTorch's OpInfo suite on neuron vs CPU"),
}


def usage() -> str:
    lines = ["usage: neuron-eager COMMAND [options]   (neuron-eager COMMAND --help; "
             "neuron-eager --version)", ""]
    lines += [f"  {name:<12} {text}" for name, (_, text) in COMMANDS.items()]
    return "\n".join(lines)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0
    if argv[0] in ("-V", "--version"):
        from importlib.metadata import PackageNotFoundError, version

        try:
            print(f"neuron-eager {version('neuron-eager')}")
        except PackageNotFoundError:  # (run from a source tree that was not installed)
            print("neuron-eager (not installed)")
        return 0
    command = COMMANDS.get(argv[0])
    if command is None:
        print(f"neuron-eager: unknown command {argv[0]!r}\n\n{usage()}", file=sys.stderr)
        return 2
    import importlib

    return importlib.import_module(command[0]).main(argv[1:])


if __name__ == "__main__":
    raise SystemExit(main())
