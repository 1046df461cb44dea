"""pip install ./python (no network needed: run it with --no-build-isolation,
or let Debian's pip use the installed setuptools). The FlatBuffers bindings
are generated from ../schema/checkpoint.fbs by flatc while building, as the
CMake build does; flatc comes from the flatbuffers-compiler package."""
import os
import shutil
import subprocess
import tempfile

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
SCHEMA = os.path.join(HERE, "..", "schema", "checkpoint.fbs")


class BuildWithBindings(build_py):
    def run(self):
        super().run()
        flatc = shutil.which("flatc")
        if flatc is None:
            raise SystemExit("distckpt: flatc not found; install Debian's flatbuffers-compiler (scripts/install-deps.sh)")
        if not os.path.isfile(SCHEMA):
            raise SystemExit(f"distckpt: {SCHEMA} not found; install from a distckpt source tree")
        with tempfile.TemporaryDirectory() as tmp:
            subprocess.run([flatc, "--python", "-o", tmp, SCHEMA], check=True)
            target = os.path.join(self.build_lib, "distckpt", "fb")
            shutil.rmtree(target, ignore_errors=True)
            shutil.copytree(os.path.join(tmp, "distckpt", "fb"), target)


setup(
    name="distckpt",
    version="0.1.0",
    description="Read and write distckpt checkpoints from PyTorch (torch.distributed.checkpoint storage)",
    packages=["distckpt"],
    python_requires=">=3.9",
    install_requires=["flatbuffers", "xxhash", "numpy", "torch"],
    cmdclass={"build_py": BuildWithBindings},
)
