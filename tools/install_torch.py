"""Install a CPU build of torch into the running interpreter's environment.

PyPI's default torch wheel for Linux bundles CUDA (several GB). A CPU build is enough for
this course, so on Linux we take it from PyTorch's CPU index. A wheel already configured
locally (pip's find-links, as on our CI machines) is used first and needs no network.
"""
import platform
import subprocess
import sys

version = sys.argv[1] if len(sys.argv) > 1 else "2.13.0"
pip = [sys.executable, "-m", "pip", "install", "--quiet"]


def run(args):
    return subprocess.run(pip + args).returncode == 0


def have():
    try:
        out = subprocess.run([sys.executable, "-c", "import torch; print(torch.__version__)"],
                             capture_output=True, text=True)
        return out.returncode == 0 and out.stdout.strip().split("+")[0] == version
    except OSError:
        return False


if have():
    sys.exit(0)
# 1. a local wheel (find-links / a wheelhouse), no index, no network
if run(["--no-index", "--no-deps", f"torch=={version}"]):
    sys.exit(0)
# 2. Linux: PyTorch's CPU-only wheels; elsewhere PyPI's wheels are CPU builds already
if platform.system() == "Linux" and run(
        [f"torch=={version}", "--index-url", "https://download.pytorch.org/whl/cpu",
         "--extra-index-url", "https://pypi.org/simple"]):
    sys.exit(0)
sys.exit(0 if run([f"torch=={version}"]) else 1)
