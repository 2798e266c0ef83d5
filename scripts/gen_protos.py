"""Regenerate the committed protobuf / gRPC code from every .proto in the project.

    python scripts/gen_protos.py          # rewrite the generated files in place
    python scripts/gen_protos.py --check  # exit 1 (and list them) if any is stale

Generated files sit beside their .proto: NAME_pb2.py, NAME_pb2.pyi and, for files
that declare a service, NAME_pb2_grpc.py. The proto root is the repository root,
so `bookie/wire/bookie.proto` is imported as `bookie.wire.bookie_pb2`.

protoc's stubs are used as written but for one repair: an enum value named after a
Python keyword (Pulsar's `Schema.Type.None`) becomes a stub line `None: ...`, which is
a syntax error that stops mypy. Such a value can only be reached by name
(`Schema.Type.Value("None")`), never as an attribute, so its stub lines are dropped.
"""

from __future__ import annotations

import argparse
import filecmp
import keyword
import re
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_DIRS = ("bookie", "metadata", "streamlib")
# A stub line annotating an attribute whose name is a Python keyword: `    None: X`.
KEYWORD_ATTRIBUTE = re.compile(
    r"^[ \t]*(?:" + "|".join(keyword.kwlist) + r")[ \t]*:.*\n", re.MULTILINE
)


def proto_files() -> list[Path]:
    found: list[Path] = []
    for top in PROTO_DIRS:
        found.extend(sorted((ROOT / top).rglob("*.proto")))
    return [p.relative_to(ROOT) for p in found]


def drop_keyword_attributes(stub: Path) -> None:
    """Remove the stub lines protoc writes for keyword-named enum values (see above)."""
    text = stub.read_text()
    fixed = KEYWORD_ATTRIBUTE.sub("", text)
    if fixed != text:
        stub.write_text(fixed)


def generate(out_dir: Path) -> list[Path]:
    """Compile every proto into out_dir; return the generated paths (relative)."""
    from grpc_tools import protoc  # the test extra installs grpcio-tools

    written: list[Path] = []
    for proto in proto_files():
        has_service = "\nservice " in (ROOT / proto).read_text()
        args = [
            "protoc",
            f"-I{ROOT}",
            f"--python_out={out_dir}",
            f"--pyi_out={out_dir}",
            str(ROOT / proto),
        ]
        if has_service:
            args.insert(3, f"--grpc_python_out={out_dir}")
        if protoc.main(args) != 0:
            raise SystemExit(f"protoc failed on {proto}")
        stem = proto.with_suffix("")
        drop_keyword_attributes(out_dir / f"{stem}_pb2.pyi")
        written += [Path(f"{stem}_pb2.py"), Path(f"{stem}_pb2.pyi")]
        if has_service:
            written.append(Path(f"{stem}_pb2_grpc.py"))
    return written


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only report stale files")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp_dir = Path(tmp)
        generated = generate(tmp_dir)
        stale = [
            rel
            for rel in generated
            if not (ROOT / rel).exists()
            or not filecmp.cmp(tmp_dir / rel, ROOT / rel, shallow=False)
        ]
        if args.check:
            for rel in stale:
                print(f"stale: {rel}")
            return 1 if stale else 0
        for rel in generated:
            (ROOT / rel).write_bytes((tmp_dir / rel).read_bytes())
            print(f"wrote {rel}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
