"""Where the command-line tools write: checked before a run, not found unusable after it."""
from __future__ import annotations

import argparse
import os
from pathlib import Path


def folder(parser: argparse.ArgumentParser, flag: str, path: str) -> Path:
    """The folder `path`, made now (with its parents); a usage error if it cannot be."""
    out = Path(path)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        parser.error(f"{flag} {path}: cannot make this folder ({e.strerror or e})")
    if not os.access(out, os.W_OK):
        parser.error(f"{flag} {path}: this folder is not writable")
    return out


def file(parser: argparse.ArgumentParser, flag: str, path: str) -> Path:
    """The file `path`, its folder made now; a usage error if it cannot be written."""
    out = Path(path)
    if out.is_dir():
        parser.error(f"{flag} {path}: this is a folder, not a file")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        parser.error(f"{flag} {path}: cannot make its folder {out.parent} ({e.strerror or e})")
    if not os.access(out if out.exists() else out.parent, os.W_OK):
        parser.error(f"{flag} {path}: this file is not writable")
    return out
