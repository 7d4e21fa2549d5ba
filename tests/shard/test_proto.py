"""The committed protobuf modules are exactly what protoc (grpcio-tools') generates from follow.proto."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GENERATED = ["follow_pb2.py", "follow_pb2.pyi"]


def test_generated_modules_match_the_proto(tmp_path):
    subprocess.run(
        [
            sys.executable, "-m", "grpc_tools.protoc", f"-I{ROOT}",
            f"--python_out={tmp_path}", f"--pyi_out={tmp_path}",
            str(ROOT / "watchcache/shard/follow.proto"),
        ],
        check=True,
    )  # fmt: skip
    for name in GENERATED:
        fresh = (tmp_path / "watchcache/shard" / name).read_text()
        committed = (ROOT / "watchcache/shard" / name).read_text()
        assert fresh == committed, f"{name} is stale: run `make proto`"
