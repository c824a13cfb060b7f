"""The container image's recipe (scripts/Dockerfile) and its lock files.

No container daemon here: the recipe is checked by reading (rules a linter would apply,
and the contract the manifests rely on); the lock files are checked to pin every package
with hashes and to satisfy the project's dependencies (the GPU one, TensorFlow's and-cuda
extra); and the CPU lock is installed as the Dockerfile installs it, --no-deps into a fresh
venv then the project --no-deps and `pip check`, and the trainer from it runs as an
arbitrary UID in group 0 with a read-only root filesystem and only /tmp and --output_dir
writable, as under OpenShift's restricted-v2 with the manifests' securityContext."""

import hashlib
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys

import pytest
import tomllib
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

import clusters
from lowlevel.ops import k8s

SCRIPTS = os.path.join(clusters.ROOT, "scripts")


def read(name):
    with open(os.path.join(SCRIPTS, name)) as f:
        return f.read()


def instructions(recipe: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of a Dockerfile, continuation lines joined, comments out."""
    out, current = [], ""
    for line in recipe.splitlines():
        if not current and (not line.strip() or line.lstrip().startswith("#")):
            continue
        current += line.rstrip("\\").strip() + " "
        if not line.rstrip().endswith("\\"):
            word, _, rest = current.strip().partition(" ")
            out.append((word.upper(), rest.strip()))
            current = ""
    return out


def test_the_recipe_pins_its_base_installs_from_the_lock_then_the_project_alone():
    steps = instructions(read("Dockerfile"))
    names = [s[0] for s in steps]
    args = dict((s[1].split("=", 1) + [""])[:2] for s in steps if s[0] == "ARG")
    # The base by digest (a tag moves; a digest does not), through the BASE argument.
    assert re.fullmatch(r"python:3\.11-slim@sha256:[0-9a-f]{64}", args["BASE"]), args
    assert steps[names.index("FROM")][1] == "${BASE}"
    assert args["VARIANT"] == "cpu"
    copies = [s[1] for s in steps if s[0] == "COPY"]
    runs = [s[1] for s in steps if s[0] == "RUN"]
    # The lock's layer first and alone: README and source edits do not reinstall TensorFlow.
    assert copies[0] == "scripts/requirements-${VARIANT}.lock /tmp/requirements.lock"
    assert "pip install --no-deps --require-hashes -r /tmp/requirements.lock" in runs[0]
    first_source = names.index("COPY", names.index("COPY") + 1)
    assert names.index("RUN") < first_source
    assert any("README.md" in c for c in copies[1:]) and "README.md" not in copies[0]
    project = next(r for r in runs if "pip install" in r and "requirements" not in r)
    assert "--no-deps" in project and "pip check" in project
    # Any UID: a numeric non-root user (runAsNonRoot can check it) in group 0, HOME on /tmp.
    user = [s[1] for s in steps if s[0] == "USER"]
    assert user and user[-1].isdigit() and int(user[-1]) != 0
    assert any("--gid 0" in r and f"--uid {user[-1]}" in r for r in runs)
    env = " ".join(s[1] for s in steps if s[0] == "ENV")
    assert "HOME=/tmp" in env and "PYTHONDONTWRITEBYTECODE=1" in env
    with open(os.path.join(clusters.ROOT, "pyproject.toml"), "rb") as f:
        scripts = tomllib.load(f)["project"]["scripts"]
    entrypoint = json.loads(steps[names.index("ENTRYPOINT")][1])
    assert scripts[entrypoint[0]] == "lowlevel.trainer:run"
    exposed = {int(p) for s in steps if s[0] == "EXPOSE" for p in s[1].split()}
    assert exposed == {k8s.PORT, k8s.METRICS_PORT}
    # Lint rules: no apt caches left, no `latest`, no ADD, no sudo, pip without cache.
    assert "ADD" not in names and not any("sudo" in r or "apt-get" in r for r in runs)
    assert ":latest" not in read("Dockerfile") and "PIP_NO_CACHE_DIR=1" in env


def test_the_build_context_holds_what_the_recipe_copies():
    ignore = read("Dockerfile.dockerignore").splitlines()
    allowed = {line[1:].rstrip("/") for line in ignore if line.startswith("!")}
    for source in ("pyproject.toml", "README.md", "lowlevel", "scripts/requirements-cpu.lock",
                   "scripts/requirements-gpu.lock"):
        assert source in allowed, source
        assert os.path.exists(os.path.join(clusters.ROOT, source)), source


def lock(variant) -> dict[str, tuple[str, list[str]]]:
    """{canonical name: (version, [hashes])} of scripts/requirements-VARIANT.lock."""
    text = read(f"requirements-{variant}.lock")
    pins = {}
    for block in re.split(r"\n(?=[A-Za-z0-9])", text.split("\n", 2)[2]):
        m = re.match(r"([A-Za-z0-9._-]+)==([^\s\\;]+)", block)
        assert m, block[:200]
        hashes = re.findall(r"--hash=sha256:([0-9a-f]{64})", block)
        pins[canonicalize_name(m.group(1))] = (m.group(2), hashes)
    return pins


def _applies(req: Requirement, extras=("",)) -> bool:
    return req.marker is None or any(req.marker.evaluate({
        "python_version": "3.11", "python_full_version": "3.11.9", "sys_platform": "linux",
        "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix",
        "implementation_name": "cpython", "platform_python_implementation": "CPython",
        "extra": e}) for e in extras)


@pytest.mark.parametrize("variant", ["cpu", "gpu"])
def test_every_package_is_pinned_with_hashes_and_the_project_needs_are_met(variant):
    pins = lock(variant)
    assert all(hashes for _, hashes in pins.values()), [n for n, (_, h) in pins.items()
                                                        if not h]
    with open(os.path.join(clusters.ROOT, "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)["project"]
    wanted = [Requirement(r) for r in project["dependencies"]]
    if variant == "gpu":
        wanted += [Requirement(r) for r in project["optional-dependencies"]["gpu"]]
    for req in wanted:
        name = canonicalize_name(req.name)
        assert name in pins and req.specifier.contains(pins[name][0], prereleases=True), req
    assert "lowlevel" not in pins  # the project goes in by itself, --no-deps
    # The build needs nothing from outside the lock (--no-build-isolation).
    assert "setuptools" in pins


def test_the_gpu_lock_has_tensorflows_cuda_libraries():
    cpu, gpu = lock("cpu"), lock("gpu")
    assert not any(n.startswith("nvidia-") for n in cpu)
    extra = {n: v for n, v in gpu.items() if n not in cpu}
    assert extra and all(n.startswith("nvidia-") for n in extra), sorted(extra)
    assert cpu["tensorflow"][0] == gpu["tensorflow"][0]
    installed = importlib.metadata.version("tensorflow")
    if installed != gpu["tensorflow"][0]:
        pytest.skip(f"the venv has TensorFlow {installed}, the lock {gpu['tensorflow'][0]}")
    cuda = [Requirement(r) for r in importlib.metadata.requires("tensorflow")
            if "and-cuda" in r]
    assert cuda
    for req in cuda:
        if _applies(req, ("and-cuda",)):
            name = canonicalize_name(req.name)
            assert name in gpu and req.specifier.contains(gpu[name][0]), req


def _closure_errors(pins) -> tuple[list[str], int]:
    """Requirements of locked packages, as installed in this venv at the locked version,
    that the lock does not satisfy (a package installed at another version is skipped);
    and how many packages were checked."""
    errors, checked = [], 0
    for name, (version, _) in pins.items():
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        if dist.version != version:
            continue
        checked += 1
        for text in dist.requires or []:
            req = Requirement(text)
            if not _applies(req):
                continue
            dep = canonicalize_name(req.name)
            if dep not in pins or not req.specifier.contains(pins[dep][0], prereleases=True):
                errors.append(f"{name} {version} needs {req}")
    return errors, checked


def test_the_cpu_lock_is_closed_under_its_packages_requirements():
    pins = lock("cpu")
    errors, checked = _closure_errors(pins)
    assert errors == [] and checked >= len(pins) // 2, (errors, checked, len(pins))
    del pins["six"]  # the check can fail
    assert any("six" in e for e in _closure_errors(pins)[0])


# A fresh venv from the lock, as the Dockerfile builds it. Kept in .venv/image-test/<lock
# hash>, so the ~700 MB of wheels are fetched once per lock, not at every run.
def _base_python() -> str:
    """An interpreter any UID may run (a pyenv under /root is closed to others)."""
    v = f"python{sys.version_info.major}.{sys.version_info.minor}"
    for candidate in (f"/usr/bin/{v}", f"/usr/local/bin/{v}"):
        if os.path.exists(candidate):
            return candidate
    return sys._base_executable


def _image_venv() -> str:
    text = read("requirements-cpu.lock")
    path = os.path.join(clusters.ROOT, ".venv", "image-test",
                        hashlib.sha256(text.encode()).hexdigest()[:12])
    stamp = os.path.join(path, ".installed")
    if os.path.exists(stamp):
        return path
    shutil.rmtree(path, ignore_errors=True)
    subprocess.run([_base_python(), "-m", "venv", path], check=True, timeout=120)
    pip = [os.path.join(path, "bin", "python"), "-m", "pip", "install", "-q"]
    # A clean pip configuration, as in the image's build: the lock alone decides.
    env = dict(clusters.ENV, PIP_CONFIG_FILE=os.devnull, PIP_CONSTRAINT="",
               PIP_FIND_LINKS="", PIP_NO_CACHE_DIR="0")
    result = subprocess.run(pip + ["--no-deps", "--require-hashes", "-r",
                                   os.path.join(SCRIPTS, "requirements-cpu.lock")],
                            env=env, capture_output=True, text=True, timeout=1500)
    assert result.returncode == 0, result.stderr[-3000:]
    with open(stamp, "w") as f:
        f.write("ok\n")
    return path


@pytest.mark.cluster  # installs the lock into a venv (the package index, ~2 min the first
@pytest.mark.timeout(1800)  # time), then runs the trainer from it
def test_the_lock_installs_alone_and_the_trainer_runs_under_any_uid_on_a_read_only_root(
        tmp_path):
    if (os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("setpriv")
            or any(os.listdir(d) for d in ("/srv", "/media") if os.path.isdir(d))
            or not all(os.path.isdir(d) for d in ("/srv", "/media"))):
        pytest.skip("needs root, unshare, setpriv and empty /srv and /media to mount on")
    venv = _image_venv()
    python = os.path.join(venv, "bin", "python")
    # The project as the Dockerfile adds it, into a copy of the venv's site (the cached
    # venv stays as the lock made it): --no-deps --no-build-isolation, then pip check.
    target = tmp_path / "site"
    env = dict(clusters.ENV, PIP_CONFIG_FILE=os.devnull, PIP_CONSTRAINT="", PIP_FIND_LINKS="")
    result = subprocess.run([python, "-m", "pip", "install", "-q", "--no-deps",
                             "--no-build-isolation", "--target", str(target), clusters.ROOT],
                            env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    env_site = dict(env, PYTHONPATH=str(target))
    check = subprocess.run([python, "-m", "pip", "check"], env=env_site, capture_output=True,
                           text=True, timeout=120)
    assert check.returncode == 0 and "No broken requirements" in check.stdout, check.stdout
    # OpenShift's restricted-v2: an arbitrary UID in group 0; the manifests: a read-only
    # root, an emptyDir at /tmp, the volume at --output_dir writable for the pod's group.
    out = tmp_path / "out"
    out.mkdir()
    os.chown(out, 0, 0)
    os.chmod(out, 0o770)
    os.chmod(tmp_path, 0o755)
    # (/srv and /media: empty directories of the host's that stay so: the mounts are in a
    # mount namespace of this test's own. The venv and the project are bound under a tmpfs
    # at /media, as an image holds them at a path of its own: where this checkout lives --
    # maybe under /tmp, which the pod's emptyDir covers, or in a 0700 directory such as
    # mktemp's -- is then neither hidden nor closed to the arbitrary UID.)
    trainer = (f"exec setpriv --reuid=1000660000 --regid=0 --clear-groups env -i "
               f"HOME=/tmp PATH=/usr/bin:/bin PYTHONPATH=/media/site PYTHONDONTWRITEBYTECODE=1 "
               f"/media/venv/bin/python -m lowlevel.trainer --output_dir=/srv --train_steps=30 "
               f"--save_checkpoint_steps=10 --keep_exports=1")
    script = (f"mount -t tmpfs -o size=1m,mode=755 tmpfs /media && "
              f"mkdir /media/site /media/venv && mount --bind {target} /media/site && "
              f"mount --bind {venv} /media/venv && mount --bind {out} /srv && "
              f"mount -o remount,bind,ro / && mount -t tmpfs -o size=512m tmpfs /tmp && "
              f"cd /tmp && {trainer}")
    run = subprocess.run(["unshare", "--mount", "--propagation", "private", "--", "sh", "-c",
                          script], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, (run.stdout + run.stderr)[-4000:]
    metrics = json.loads((out / "final_metrics.json").read_text())
    assert metrics["global_step"] == 30 and metrics["export_dir"].startswith("/srv/export/")
    assert (out / "final_metrics.json").stat().st_uid == 1000660000
