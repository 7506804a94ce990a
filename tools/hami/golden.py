"""Make the HAMi golden fixture: HAMi's own encoders and decoders, run once on fixed cases.

tests/wire/hami/golden-<version>.json keeps what HAMi's Go code (``pkg/device`` and
``pkg/util/nodelock`` at a pinned version) returns for fairshare's annotations and for the
annotations HAMi itself writes; tests/unit/test_hami_golden.py compares fairshare's
encoder and decoder (extender/hami.py) with it on every run, without Go or the
module proxy. Nothing of HAMi is kept in the repository: only this script, the Go program
beside it (golden/main.go, ours) and the answers.

    python tools/hami/golden.py --hami-git PATH/TO/HAMi/.git [--ref v2.9.0]
    python tools/hami/golden.py --hami-src DIR --commit SHA [--ref v2.9.0]
    ... --check      exit 1 when the fixture differs from what HAMi's code gives now

The Go program is built in a scratch module outside the clone that requires HAMi through
a ``replace`` to the source tree (so the Go module proxy need not serve HAMi; HAMi's own
dependencies come from the proxy as usual). Rerun it when extender/hami.py
changes what it writes (the unit test says so) or to pin another HAMi version.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from extender import hami  # noqa: E402

GO_MAIN = Path(__file__).resolve().parent / "golden" / "main.go"
FIXTURES = ROOT / "tests" / "wire" / "hami"
MODULE = "github.com/Project-HAMi/HAMi"

A100 = ("GPU-aaa", 81920, 100)
A100_B = ("GPU-bbb", 81920, 100)
T4 = ("GPU-ccc", 15360, 100)

# (name, pod spec, devices, share_container): what the extender hands HAMi on a bind.
POD_SPECS: list[tuple[str, dict[str, Any], list[tuple[str, int, int]], int | None]] = [
    (
        "init container, two whole GPUs, a sidecar",
        {
            "initContainers": [{"name": "fetch"}],
            "containers": [
                {"name": "train", "resources": {"limits": {"nvidia.com/gpu": "2"}}},
                {"name": "sidecar"},
            ],
        },
        [A100, A100_B],
        None,
    ),
    (
        "one container, one whole GPU",
        {"containers": [{"name": "main", "resources": {"limits": {"nvidia.com/gpu": 1}}}]},
        [T4],
        None,
    ),
    (
        "a share of one GPU for the second container (memory only, no core limit)",
        {"containers": [{"name": "log"}, {"name": "infer"}]},
        [("GPU-ccc", 20480, 0)],
        1,
    ),
    (
        "a third of a GPU's memory (5120 of 15360 MiB)",
        {"containers": [{"name": "infer"}]},
        [("GPU-ccc", 5120, 0)],
        0,
    ),
    (
        "GPU init container reuses the first device; 1 + 2 GPUs in the main containers",
        {
            "initContainers": [
                {"name": "warm", "resources": {"requests": {"nvidia.com/gpu": "1"}}}
            ],
            "containers": [
                {"name": "a", "resources": {"limits": {"nvidia.com/gpu": "1"}}},
                {"name": "b", "resources": {"limits": {"nvidia.com/gpu": "2"}}},
            ],
        },
        [A100, A100_B, ("GPU-ddd", 81920, 100)],
        None,
    ),
    (
        "no device for any container",
        {"containers": [{"name": "a"}, {"name": "b"}]},
        [],
        None,
    ),
]

# Node registers as HAMi's device plugins write them (MarshalNodeDevices: v2.8+, JSON;
# EncodeNodeDevices: the older 9-field list), from these devices.
DEVICES: list[tuple[str, list[dict[str, Any]]]] = [
    (
        "two A100s, numa 1 on the second",
        [
            {
                "id": "GPU-aaa",
                "index": 0,
                "count": 10,
                "devmem": 81920,
                "devcore": 100,
                "type": "NVIDIA-A100-SXM4-80GB",
                "numa": 0,
                "mode": "hami-core",
                "health": True,
            },
            {
                "id": "GPU-bbb",
                "index": 1,
                "count": 10,
                "devmem": 81920,
                "devcore": 100,
                "type": "NVIDIA-A100-SXM4-80GB",
                "numa": 1,
                "mode": "hami-core",
                "health": True,
            },
        ],
    ),
    (
        "indexes out of order, one unhealthy, a MIG-mode device",
        [
            {
                "id": "GPU-t2",
                "index": 2,
                "count": 4,
                "devmem": 15360,
                "devcore": 100,
                "type": "NVIDIA-Tesla T4",
                "mode": "hami-core",
                "health": True,
            },
            {
                "id": "GPU-t0",
                "index": 0,
                "count": 4,
                "devmem": 15360,
                "devcore": 100,
                "type": "NVIDIA-Tesla T4",
                "mode": "hami-core",
                "health": False,
            },
            {
                "id": "GPU-m1",
                "index": 1,
                "count": 7,
                "devmem": 40960,
                "devcore": 100,
                "type": "NVIDIA-A100-PCIE-40GB",
                "mode": "mig",
                "health": True,
            },
        ],
    ),
    ("no devices", []),
]

# Register annotations as text: older plugins' 7-field entries, and what is not well formed.
REGISTER_TEXTS: list[tuple[str, str]] = [
    ("json, zero values omitted", '[{"id":"GPU-a","count":10,"devmem":1024,"health":true}]'),
    ("json, unknown fields", '[{"id":"GPU-a","index":1,"custominfo":{"x":1},"future":"y"}]'),
    ("json, empty list", "[]"),
    ("json, not a list", '{"id":"GPU-a"}'),
    ("json, count as a string", '[{"id":"GPU-a","count":"10"}]'),
    ("json, negative index", '[{"id":"GPU-a","index":-1}]'),
    ("json, truncated", '[{"id":"GPU-a"'),
    ("legacy, 7 fields (no index) then 9",
     "GPU-a,10,81920,100,NVIDIA-A100,0,true:GPU-b,10,81920,100,NVIDIA-A100,1,false,1,hami-core:"),
    ("legacy, two 7-field entries",
     "GPU-a,10,81920,100,NVIDIA-A100,0,true:GPU-b,10,81920,100,NVIDIA-A100,0,true:"),
    ("legacy, health TRUE", "GPU-a,10,81920,100,NVIDIA-A100,0,TRUE:"),
    ("legacy, health 1", "GPU-a,10,81920,100,NVIDIA-A100,0,1:"),
    ("legacy, non-numeric devmem", "GPU-a,10,x,100,NVIDIA-A100,0,true:"),
    ("legacy, 4 fields", "GPU-a,10,1,100:"),
    ("legacy, no ':'", "GPU-a,10,81920,100,NVIDIA-A100,0,true"),
    ("legacy, no entries", "x:"),
]  # fmt: skip

LOCKS: list[tuple[str, str]] = [
    ("fairshare's lock", hami.lock_value(1_700_000_000, "lab", "train-0")),
    ("a node in UTC+1", "2023-11-14T23:13:20+01:00,lab,train-0"),
    ("fractional seconds", "2023-11-14T22:13:20.75Z,lab,train-0"),
    ("time only (before HAMi v2.5)", "2023-11-14T22:13:20Z"),
    ("two parts", "2023-11-14T22:13:20Z,lab"),
    ("four parts", "2023-11-14T22:13:20Z,lab,train,0"),
    ("not a time", "yesterday,lab,train-0"),
    ("empty", ""),
]

LOCK_KEYS = [(1_700_000_000, "lab", "train-0"), (0, "default", "p"), (4_102_444_800, "a-b", "c.d")]


def cases() -> dict[str, Any]:
    """The input of golden/main.go: fairshare's annotations, HAMi's own, odd texts."""
    pods = []
    for name, spec, devices, share in POD_SPECS:
        per = hami.container_devices(spec, devices, share_container=share)
        pods.append(
            {
                "name": name,
                "containers": [
                    [{"uuid": u, "type": hami.DEVICE_TYPE, "usedmem": m, "usedcores": c}
                     for u, m, c in devs]
                    for devs in per
                ],
                "annotation": hami.encode_pod_devices(per),
            }
        )  # fmt: skip
    return {
        "pods": pods,
        "registers": [{"name": n, "text": t} for n, t in REGISTER_TEXTS],
        "devices": [{"name": n, "devices": d} for n, d in DEVICES],
        "locks": [{"name": n, "text": t} for n, t in LOCKS],
        "lock_keys": [{"unix": u, "namespace": ns, "name": p} for u, ns, p in LOCK_KEYS],
    }


def pod_specs() -> list[dict[str, Any]]:
    """What the unit test feeds fairshare's encoder for each pod case, by name."""
    return [
        {"name": n, "spec": s, "devices": [list(d) for d in ds], "share_container": c}
        for n, s, ds, c in POD_SPECS
    ]


def _go(args: list[str], cwd: Path) -> str:
    proc = subprocess.run(["go", *args], cwd=cwd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        sys.exit(f"go {' '.join(args)} in {cwd} failed:\n{proc.stderr[-4000:]}")
    return proc.stdout


def _k8s_replaces(hami_go_mod: str) -> list[str]:
    """HAMi's k8s.io replace directives (a dependency's replaces do not apply to us)."""
    block = re.search(r"^replace \((.*?)^\)", hami_go_mod, re.S | re.M)
    lines = block.group(1).splitlines() if block else []
    return [f"replace {ln.strip()}" for ln in lines if ln.strip().startswith("k8s.io/")]


def build(src: Path, work: Path) -> Path:
    """golden/main.go built against the HAMi tree ``src`` in the scratch module ``work``."""
    if shutil.which("go") is None:
        sys.exit("golden: 'go' not found; HAMi's code is Go")
    (work / "main.go").write_text(GO_MAIN.read_text())
    module = (
        "module fairshare.test/hamigolden\n\ngo 1.26\n\n"
        f"require {MODULE} v0.0.0\n\nreplace {MODULE} => {src.resolve()}\n"
    )
    module += "\n".join(_k8s_replaces((src / "go.mod").read_text())) + "\n"
    (work / "go.mod").write_text(module)
    _go(["mod", "tidy"], work)
    _go(["build", "-o", "golden", "."], work)
    return work / "golden"


def run(binary: Path) -> dict[str, Any]:
    proc = subprocess.run(
        [str(binary)], input=json.dumps(cases()), capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        sys.exit(f"golden: {binary} exited {proc.returncode}: {proc.stderr[-2000:]}")
    out: dict[str, Any] = json.loads(proc.stdout)
    return out


def _archive(git_dir: Path, ref: str, dest: Path) -> str:
    """Extract ``ref`` of the HAMi repository ``git_dir`` into ``dest``; its commit."""
    commit = subprocess.run(
        ["git", "--git-dir", str(git_dir), "rev-parse", f"{ref}^{{commit}}"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    tar = dest.parent / "hami.tar"
    with tar.open("wb") as fh:
        subprocess.run(["git", "--git-dir", str(git_dir), "archive", commit], stdout=fh, check=True)
    with tarfile.open(tar) as tf:
        tf.extractall(dest, filter="data")
    tar.unlink()
    return commit


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    where = ap.add_mutually_exclusive_group(required=True)
    where.add_argument("--hami-git", type=Path, help="a HAMi git repository (its .git dir)")
    where.add_argument("--hami-src", type=Path, help="a HAMi source tree of --ref")
    ap.add_argument("--ref", default="v2.9.0", help="HAMi tag (default v2.9.0)")
    ap.add_argument("--commit", help="the commit of --hami-src (required with it)")
    ap.add_argument("--check", action="store_true", help="compare, do not write")
    args = ap.parse_args(argv)
    fixture = FIXTURES / f"golden-{args.ref}.json"
    with tempfile.TemporaryDirectory(prefix="hami-golden-") as tmp:
        work = Path(tmp)
        if args.hami_git:
            src = work / "hami"
            commit = _archive(args.hami_git, args.ref, src)
        else:
            if not args.commit:
                ap.error("--hami-src needs --commit (the tree's commit, for the record)")
            src, commit = args.hami_src, args.commit
        module_dir = work / "module"
        module_dir.mkdir()
        answers = run(build(src, module_dir))
        go_version = _go(["env", "GOVERSION"], module_dir).strip()
    data = {
        "hami": {"module": MODULE, "version": args.ref, "commit": commit},
        "made_by": "tools/hami/golden.py (Go program tools/hami/golden/main.go)",
        "go": go_version,
        "pod_specs": pod_specs(),
        **answers,
    }
    text = json.dumps(data, indent=1, sort_keys=True) + "\n"
    if args.check:
        old = json.loads(fixture.read_text()) if fixture.is_file() else None
        same = old is not None and {k: v for k, v in old.items() if k != "go"} == {
            k: v for k, v in data.items() if k != "go"
        }
        print(f"{fixture.relative_to(ROOT)}: {'up to date' if same else 'differs'}")
        return 0 if same else 1
    fixture.parent.mkdir(parents=True, exist_ok=True)
    fixture.write_text(text)
    print(f"wrote {fixture.relative_to(ROOT)} (HAMi {args.ref} at {commit[:12]}, {go_version})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
